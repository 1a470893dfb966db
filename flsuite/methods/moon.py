"""MOON (Li, He & Song, CVPR 2021, "Model-Contrastive Federated Learning").

Local objective on a batch:   ℓ = CE(f(x), y) + μ · ℓ_con,
    ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) ),
with z, z_glob, z_prev the representations of x under the local model being trained, the round's global model
(frozen) and this client's previous local model (frozen; in its first round the global model), sim = cosine.
The server aggregates as FedAvg.

Representation: the input of the model's last `nn.Linear` (found generically with a forward hook). When that Linear
is the model's only parameterised layer (the linear-head family, GGEUR's "CLIP+MLP"), its input is the fixed
embedding, which no local update can move, so the logits are used instead (GGEUR spec §8 A18).
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from flsuite.federation.task import State
from flsuite.methods.base import ClientModule
from flsuite.methods.fedavg import FedAvg


def representation_layer(model: nn.Module) -> str | None:
    """Module name of the last `nn.Linear`, whose input is the representation; None: use the logits (the Linear is
    the model's only parameterised layer)."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("MOON/FedProto need a model whose classifier is an nn.Linear")
    with_params = [name for name, m in model.named_modules() if next(m.parameters(recurse=False), None) is not None]
    return None if with_params == [linears[-1]] else linears[-1]


def forward_with_representation(model: nn.Module, layer: str | None, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, representation [batch, d]) of one forward pass."""
    if layer is None:
        logits = model(x)
        return logits, logits
    captured: list[torch.Tensor] = []
    handle = model.get_submodule(layer).register_forward_hook(lambda m, inputs, out: captured.append(inputs[0]))
    try:
        logits = model(x)
    finally:
        handle.remove()
    return logits, captured[-1].flatten(1)


def frozen_copy(model: nn.Module) -> nn.Module:
    """An eval-mode copy without gradients (a fixed reference model for the round)."""
    other = copy.deepcopy(model).eval()
    for p in other.parameters():
        p.requires_grad_(False)
    return other


class MoonClient(ClientModule):
    """CE + μ · model-contrastive loss; keeps its trained weights (the next round's previous model) as state."""

    method: MOON

    def on_fit_start(self) -> None:
        self._layer = representation_layer(self.model)
        # in a plain dict, so that Lightning and the optimiser do not see them as submodules
        self._frozen = {"global": frozen_copy(self.model), "prev": frozen_copy(self.model)}  # global weights now
        previous = self.task.state.get("prev")
        if previous:
            self._frozen["prev"].load_state_dict(previous)

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits, z = forward_with_representation(self.model, self._layer, x)
        with torch.no_grad():
            _, z_glob = forward_with_representation(self._frozen["global"], self._layer, x)
            _, z_prev = forward_with_representation(self._frozen["prev"], self._layer, x)
        tau = self.method.temperature
        sims = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1) / tau
        contrastive = F.cross_entropy(sims, torch.zeros(len(y), dtype=torch.long, device=y.device))
        return F.cross_entropy(logits, y) + self.method.mu * contrastive

    def next_state(self) -> State:
        return {"prev": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}}


class MOON(FedAvg):
    """MOON: model-contrastive local loss (positive: global model, negative: previous local model); FedAvg
    aggregation.

    Args:
        mu: Weight μ of the contrastive loss (1.0, GGEUR's benchmark). μ = 0 is FedAvg.
        temperature: Temperature τ of the cosine similarities (0.5).
        weighting: Aggregation weights, as FedAvg: "samples" or "uniform".
    """

    client_module = MoonClient

    def __init__(self, mu: float = 1.0, temperature: float = 0.5, weighting: Literal["samples", "uniform"] = "samples") -> None:
        super().__init__(weighting=weighting)
        if mu < 0 or temperature <= 0:
            raise ValueError(f"MOON needs mu >= 0 and temperature > 0, got mu={mu}, temperature={temperature}")
        self.mu, self.temperature = mu, temperature
