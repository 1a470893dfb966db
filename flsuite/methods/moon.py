"""MOON (Li, He & Song, CVPR 2021, "Model-Contrastive Federated Learning").

Local objective on a batch:   ℓ = CE(f(x), y) + μ · ℓ_con,
    ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) ),
with z, z_glob, z_prev the representations of x under the local model being trained, the round's global model
(frozen) and this client's previous local model (frozen; in its first round the global model), sim = cosine.
The server aggregates as FedAvg.

Representation: the model's `features(x)` (the model contract, `flsuite.models.representation`). When `features`
has no trainable parameters (the linear-head family, GGEUR's "CLIP+MLP"), its output is the fixed embedding, which
no local update can move, so the logits are used instead (GGEUR spec §8 A18).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule
from flsuite.federation.task import State
from flsuite.methods.fedavg import FedAvg
from flsuite.models.representation import forward_with_representation, frozen_copy, logits_as_representation


@dataclass(frozen=True)
class MoonClientSettings:
    """What MOON's clients read (see `MOON`)."""

    mu: float
    temperature: float


class MoonClient(ClientModule[MoonClientSettings]):
    """CE + μ · model-contrastive loss; keeps its trained weights (the next round's previous model) as state."""

    def begin(self) -> None:
        self._use_logits = logits_as_representation(self.model)
        # in a plain dict, so that Lightning and the optimiser do not see them as submodules
        self._frozen = {"global": frozen_copy(self.model), "prev": frozen_copy(self.model)}  # global weights now
        previous = self.task.state.get("prev")
        if previous:
            self._frozen["prev"].load_state_dict(previous)

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits, z = forward_with_representation(self.model, x, self._use_logits)
        with torch.no_grad():
            _, z_glob = forward_with_representation(self._frozen["global"], x, self._use_logits)
            _, z_prev = forward_with_representation(self._frozen["prev"], x, self._use_logits)
        tau = self.method.temperature
        sims = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1) / tau
        contrastive = F.cross_entropy(sims, torch.zeros(len(y), dtype=torch.long, device=y.device))
        ce = F.cross_entropy(logits, y)
        return ce + self.method.mu * contrastive, {self.TASK_LOSS: ce}

    def next_state(self, fit: FitStatistics) -> State:
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

    def client_settings(self) -> MoonClientSettings:
        return MoonClientSettings(self.mu, self.temperature)

    def __init__(
        self, mu: float = 1.0, temperature: float = 0.5, weighting: Literal["samples", "uniform"] = "samples"
    ) -> None:
        super().__init__(weighting=weighting)
        if mu < 0 or temperature <= 0:
            raise ValueError(f"MOON needs mu >= 0 and temperature > 0, got mu={mu}, temperature={temperature}")
        self.mu, self.temperature = mu, temperature
