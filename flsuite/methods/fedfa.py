"""FedFA (Zhou & Konukoglu, ICLR 2023, "FedFA: Federated Feature Augmentation"): feature statistics perturbed with
Gaussian noise whose variance combines the client's batch and the federation's shared statistics.

Client k, each local step, at each of its layers (default: the representation z = `model.features(x)`, the model
contract's: an MLP head's hidden features, the input embedding for a linear head; or named submodules' outputs, e.g. a
CNN's blocks, as the official networks): with probability p (one draw per batch and layer) z is replaced by FFA's x̂ = γ
⊙ (z − μ)/σ + β, β ~ N(μ, (γ_μ + 1) Σ²_μ), γ ~ N(σ, (γ_σ + 1) Σ²_σ) (`flsuite.methods.fedfa_layer`: μ, σ per sample and
channel, Σ² their batch variances, γ_μ, γ_σ the adaptive weights of the shared variances Σ²_μ̄, Σ²_σ̄); the loss is the
model's CE. Every step also updates, per layer, the running statistics the client started the round with:
    μ̄ ← α μ̄ + (1 − α) mean_b μ_b,    σ̄ ← α σ̄ + (1 − α) mean_b σ_b          (momentum α = 0.99)
and uploads (μ̄^k, σ̄^k) [C] per layer (float32) besides its weights. Server, after FedAvg on the weights, per layer:
    μ̄ ← Σ_k w_k μ̄^k,  σ̄ ← Σ_k w_k σ̄^k         (the aggregation's weights, as the official code averages them)
    Σ²_μ̄ = (1/K) Σ_k (μ̄^k − mean_k μ̄^k)²,  Σ²_σ̄ likewise   (per channel over the round's K clients)
and broadcasts (μ̄, σ̄, Σ²_μ̄, Σ²_σ̄) [C] each to the next round's clients (in round 1 nothing: the clients start from
0, 1, 1, 1, the official buffers' initial values). Both ways are counted in the round's bytes. p = 0 trains exactly
as FedAvg.

Sources and deviations (docs/baselines.md): the paper and the official code (tfzhou/FedFA pyfed/utils/ffa_layer.py,
pyfed/manager/comm.py FedFAComm):
- Placement: the official networks put an FFA layer after every convolutional block (AlexNet's five); `layers`
  names them for the suite's backbones, and defaults to the representation the model contract exposes (the issue's
  "CLIP+MLP": the MLP's hidden features). On a feature vector every unit is a channel of one position, so σ = √ε,
  Σ²_σ ≈ ε and FFA is β: per-unit Gaussian noise around the feature with variance (γ_μ + 1) Σ²_μ.
- `variance: paper` (default) takes the batch and client variances with 1/B and 1/K, per channel; the official code
  uses unbiased variances and computes the shared one as `torch.var` of all clients' channels at once, a scalar,
  which makes γ_μ = γ_σ = 1 whatever the clients send: `variance: official` reproduces it.
- The official layer updates its running statistics only on the batches it augments (its coin is drawn before the
  update); here every training step updates them, the statistics being the client's, not the augmentation's.
- The coin and the Gaussian draws come from torch's seeded stream (the official code's coin is numpy's).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule
from flsuite.federation.task import ClientResult, State, Weights
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedfa_layer import VarianceForm, client_variance, ffa
from flsuite.models.representation import check_contract

#: The layer name that means the model's representation `features(x)` (the model contract).
FEATURES = "features"
#: Per layer L, what a client uploads: "L/mean", "L/std" (its running statistics); the server also broadcasts its
#: shared variances "L/var_mean", "L/var_std". Absent (round 1): the official buffers' initial values 0, 1, 1, 1.
RUNNING = ("mean", "std")
INITIAL = {"mean": 0.0, "std": 1.0, "var_mean": 1.0, "var_std": 1.0}


@dataclass(frozen=True)
class FedFAClientSettings:
    """What FedFA's clients read (see `FedFA`)."""

    p: float
    momentum: float
    eps: float
    variance: VarianceForm
    layers: tuple[str, ...]


class FedFAClient(ClientModule[FedFAClientSettings]):
    """CE with FFA (probability p per layer and batch) at the method's layers; keeps the running statistics it
    uploads. Intermediate layers are augmented by forward hooks, the representation between `features` and `head`.
    `local.loop: auto` keeps it lean: compiled, its 2 × B × C normals a step come from inductor's per-element generator
    (1.6 ms a step on a [16, 1280] representation), 10-15 s a round on digits_offline against lean's 3.6."""

    compiled_pays = False

    def begin(self) -> None:
        self._contract = check_contract(self.model)
        modules = dict(self.model.named_modules())
        hooked = [name for name in self.method.layers if name != FEATURES]
        unknown = [name for name in hooked if name not in modules]
        if unknown:
            raise ValueError(
                f"FedFA layers {unknown} are not submodules of {type(self.model).__name__} "
                f"(its modules: {[n for n in modules if n]})"
            )
        self._handles = [modules[name].register_forward_hook(functools.partial(self._hook, name)) for name in hooked]
        self._state = {k: v.to(self.device, copy=True) for k, v in self.task.broadcast.items()}
        self._step: dict[str, torch.Tensor] | None = None  # the running step's statistics, while its forward runs
        self._sums: dict[str, torch.Tensor] = {}

    def end(self, fit: FitStatistics) -> None:
        for handle in self._handles:
            handle.remove()

    def _value(self, name: str, key: str, z: torch.Tensor) -> torch.Tensor:
        """This layer's broadcast `key`, or its initial value (round 1), for z's channels."""
        held = self._state.get(f"{name}/{key}")
        return held if held is not None else torch.full((z.shape[1],), INITIAL[key], device=z.device, dtype=z.dtype)

    def _augment(self, name: str, z: torch.Tensor, step: dict[str, torch.Tensor]) -> torch.Tensor:
        """FFA at layer `name` with probability p; its statistics go into `step` under "name/..."."""
        m = self.method
        apply = torch.rand((), device=z.device) < m.p
        draws = torch.randn((2, *z.shape[:2]), device=z.device, dtype=z.dtype)
        augmented, stats = ffa(
            z, self._value(name, "var_mean", z), self._value(name, "var_std", z), draws[0], draws[1], m.eps, m.variance
        )
        step.update({f"{name}/{key}": v for key, v in {**stats, "applied": apply}.items()})
        return torch.where(apply, augmented, z)

    def _hook(self, name: str, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor | None:
        step = self._step
        return self._augment(name, output, step) if module.training and step is not None else None

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # A dict made here for the hooks to fill, dropped before returning: under `local.loop: compiled` nothing the
        # traced call made stays reachable from the client but what it returns.
        step: dict[str, torch.Tensor] = {}
        self._step = step
        z = self._contract.features(x)  # the hooked layers augment inside
        self._step = None
        if FEATURES in self.method.layers:
            z = self._augment(FEATURES, z, step)
        return F.cross_entropy(self._contract.head(z), y), step

    def gather(self, statistics: dict[str, torch.Tensor]) -> None:
        a = self.method.momentum
        for name in self.method.layers:
            if f"{name}/mean" not in statistics:
                continue
            for key in RUNNING:
                new = statistics[f"{name}/{key}"]
                old = self._state.get(f"{name}/{key}")
                old = torch.full_like(new, INITIAL[key]) if old is None else old
                self._state[f"{name}/{key}"] = a * old + (1 - a) * new
            for key in ("applied", "noise_std"):
                total = self._sums.get(f"{name}/{key}", torch.zeros((), dtype=torch.float64, device=self.device))
                self._sums[f"{name}/{key}"] = total + statistics[f"{name}/{key}"].double()

    def metrics(self, fit: FitStatistics) -> dict[str, float]:
        return {key: float(total) / max(fit.num_steps, 1) for key, total in self._sums.items()}

    def upload(self, fit: FitStatistics) -> dict[str, torch.Tensor]:
        return {
            f"{n}/{k}": self._state[f"{n}/{k}"].detach().float().cpu()
            for n in self.method.layers
            for k in RUNNING
            if f"{n}/{k}" in self._state
        }


class FedFA(FedAvg):
    """FedFA: federated feature augmentation; FedAvg aggregation.

    Args:
        p: Probability that a batch is augmented at a layer (0.5, the official FFALayer's `prob`); 0 is FedAvg's
            training.
        momentum: α of the running statistics (0.99, the official `momentum1`).
        eps: ε of the variances and σ (1e-6, the official value).
        variance: "paper" (1/B, 1/K, per channel) or "official" (the official code's variances; module docstring).
        layers: Where FFA acts: "features" (the model's representation, e.g. an MLP head's hidden features) and/or
            names of submodules (`model.named_modules()`) whose outputs it augments, as the official networks do
            after every convolutional block (a SmallCNN's blocks end at "3" and "7" on 8×8 inputs).
        weighting: FedAvg's weights, also those of the running statistics: "samples" or "uniform" (the official
            code's, 1/K).
    """

    client_module = FedFAClient

    def client_settings(self) -> FedFAClientSettings:
        return FedFAClientSettings(self.p, self.momentum, self.eps, self.variance, tuple(self.layers))

    def __init__(
        self,
        p: float = 0.5,
        momentum: float = 0.99,
        eps: float = 1e-6,
        variance: VarianceForm = "paper",
        layers: Sequence[str] = (FEATURES,),
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        super().__init__(weighting=weighting)
        if not 0 <= p <= 1 or not 0 <= momentum < 1 or eps <= 0:
            raise ValueError(f"FedFA needs 0 <= p <= 1, 0 <= momentum < 1 and eps > 0, got {p}, {momentum}, {eps}")
        if variance not in ("paper", "official"):
            raise ValueError(f"FedFA variance must be 'paper' or 'official', got {variance!r}")
        if not layers or len(set(layers)) != len(layers):
            raise ValueError(f"FedFA layers must be distinct names, at least one, got {list(layers)}")
        self.p, self.momentum, self.eps, self.variance, self.layers = (
            p,
            momentum,
            eps,
            variance,
            [str(n) for n in layers],
        )

    def broadcast(self, round: int, server_state: State) -> dict[str, torch.Tensor]:
        return dict(server_state)

    def aggregate(
        self, round: int, global_weights: Weights, results: Sequence[ClientResult], server_state: State, ctx=None
    ) -> tuple[Weights, State]:
        weights, _ = super().aggregate(round, global_weights, results, server_state)
        uploading = [r for r in results if r.upload]
        if not uploading:
            return weights, server_state
        c = torch.tensor(self.aggregation_coefficients(uploading), dtype=torch.float64)
        c = c / c.sum()
        state = dict(server_state)
        for key in uploading[0].upload:  # "L/mean", "L/std"
            stats = torch.stack([r.upload[key] for r in uploading]).to(torch.float64)  # [K, C]
            layer, stat = key.rsplit("/", 1)
            state[key] = (c @ stats).float()
            state[f"{layer}/var_{stat}"] = client_variance(stats, self.variance).float()
        return weights, state
