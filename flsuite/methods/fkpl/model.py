"""FKPL's Stage-II model: the V expert encoders concatenated and frozen, F(x) = [f_1(x); …; f_V(x)] ∈ R^{d_V}, and
optionally one linear head over it (the evaluated model head ∘ F). The experts' Stage-I heads are discarded: they are
kept as non-persistent buffers, so the state dict — what a client downloads — holds exactly the V encoders (V·P_f,
Table 9). The encoders always run in eval mode (BatchNorm running statistics, no dropout; spec §1.4 [OURS]). Also
Stage I's `SeededInit` (an expert from its own initial draw)."""

from __future__ import annotations

import torch
from torch import nn

from flsuite.federation.task import Weights
from flsuite.models.heads import ModelSpec
from flsuite.models.representation import check_contract
from flsuite.seeding import seed_torch


def head_keys(model: nn.Module) -> set[str]:
    """State-dict names of the contract head's parameters (e.g. "2.weight" of an MLP, "fc.bias" of a ResNet)."""
    head = {id(p) for p in check_contract(model).head.parameters()}
    return {n for n, p in model.named_parameters() if id(p) in head}


def encoder_weights(expert_weights: list[Weights], dropped: set[str]) -> Weights:
    """F's weights from the Stage-I experts' full weights: expert v's encoder entries under "experts.v."."""
    return {f"experts.{v}.{k}": t for v, w in enumerate(expert_weights) for k, t in w.items() if k not in dropped}


def _drop_head(expert: nn.Module) -> None:
    head = check_contract(expert).head
    for name in ("weight", "bias"):
        t = getattr(head, name, None)
        if isinstance(t, nn.Parameter):
            delattr(head, name)
            head.register_buffer(name, t.detach(), persistent=False)


class ConcatModel(nn.Module):
    """Frozen concatenated encoders (`features`) and an optional trainable linear `head`."""

    def __init__(
        self, experts: list[nn.Module], input_shape: tuple[int, ...], num_classes: int, with_head: bool
    ) -> None:
        super().__init__()
        for e in experts:
            _drop_head(e)
            e.requires_grad_(False)
        self.experts = nn.ModuleList(experts).eval()
        with torch.no_grad():
            self.dim = int(self.features(torch.zeros(2, *input_shape)).shape[1])
        self.head = nn.Linear(self.dim, num_classes) if with_head else None

    def train(self, mode: bool = True) -> ConcatModel:
        super().train(mode)
        self.experts.eval()
        return self

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([check_contract(e).features(x) for e in self.experts], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.head is None:
            raise RuntimeError(
                "this ConcatModel was built without a head (Stage II's client queries use features only)"
            )
        return self.head(self.features(x))


class SeededInit(ModelSpec):
    """`expert` initialised from its own stream: built under `seed_torch(seed)` inside a forked global RNG (the global
    stream is left as it was). `expert_init: independent` gives expert v the seed derive_seed(seed, purpose=
    "fkpl/expert<v>/model_init"), so each cluster's expert starts from its own draw (the official code, and
    `expert_init: shared`, start every expert from one draw)."""

    def __init__(self, expert: ModelSpec, seed: int) -> None:
        self.expert, self.seed = expert, seed

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            seed_torch(self.seed)
            return self.expert.build(input_shape, num_classes)


class ConcatExperts(ModelSpec):
    """V experts of architecture `expert`, concatenated and frozen.

    Args:
        expert: The Stage-I expert architecture (encoder + head; the head is dropped).
        num_experts: V.
        weights: F's weights ("experts.v.<key>"), loaded at build; null leaves them to the caller (a query loads them).
        with_head: Add the trainable linear head over F (d_V → classes).
    """

    def __init__(
        self, expert: ModelSpec, num_experts: int, weights: Weights | None = None, with_head: bool = True
    ) -> None:
        if num_experts < 1:
            raise ValueError(f"ConcatExperts needs num_experts >= 1, got {num_experts}")
        self.expert, self.num_experts, self.weights, self.with_head = expert, num_experts, weights, with_head

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        model = ConcatModel(
            [self.expert.build(input_shape, num_classes) for _ in range(self.num_experts)],
            input_shape,
            num_classes,
            self.with_head,
        )
        if self.weights is not None:
            missing, unexpected = model.load_state_dict(self.weights, strict=False)
            if unexpected or [k for k in missing if not k.startswith("head.")]:
                raise ValueError(
                    f"ConcatExperts: encoder weights do not fit (missing {missing}, unexpected {unexpected})"
                )
        return model


@torch.no_grad()
def encode(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """F(x) in eval mode, in batches (`model`: a `ConcatModel`, with or without its head)."""
    if not isinstance(model, ConcatModel):
        raise TypeError(f"FKPL encodes with the concatenated experts (ConcatExperts), got {type(model).__name__}")
    model.eval()
    return (
        torch.cat([model.features(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])
        if len(x)
        else x.new_zeros(0)
    )
