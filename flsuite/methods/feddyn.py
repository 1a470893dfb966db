"""FedDyn (Acar et al., ICLR 2021, "Federated Learning Based on Dynamic Regularization").

Client k in round t, from the global weights θ^{t−1}, minimises
    L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + α/2 ‖θ − θ^{t−1}‖²
and then updates its state (the gradient of its loss at its last local optimum, zeros at first)
    ∇L_k(θ_k^t) ← ∇L_k(θ_k^{t−1}) − α (θ_k^t − θ^{t−1}).
Server, over the round's clients S of N:
    h^t = h^{t−1} − α (1/N) Σ_{k∈S} (θ_k^t − θ^{t−1}),      θ^t = (1/|S|) Σ_{k∈S} θ_k^t − h^t / α.

The linear term, the proximal term, ∇L_k and h cover the trainable parameters only; buffers (e.g. BatchNorm
statistics) are averaged as FedAvg (∝ client sample count).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule
from flsuite.federation.task import ClientResult, State, Weights
from flsuite.methods.fedavg import FedAvg


@dataclass(frozen=True)
class FedDynClientSettings:
    """What FedDyn's clients read (see `FedDyn`)."""

    alpha: float


class FedDynClient(ClientModule[FedDynClientSettings]):
    """CE − ⟨∇L_k, θ⟩ + α/2‖θ − θ_global‖²; keeps ∇L_k (named "grad") in the client state."""

    def begin(self) -> None:
        grad: dict[str, torch.Tensor] = self.task.state.get("grad", {})
        self._anchor, self._grad = {}, {}
        for n, p in self.model.named_parameters():
            if p.requires_grad:
                self._anchor[n] = self.task.global_weights[n].detach().to(self.device, copy=True)
                self._grad[n] = grad[n].to(self.device) if n in grad else torch.zeros_like(p.detach())

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = F.cross_entropy(self.model(x), y)
        alpha = self.method.alpha
        linear = torch.zeros((), device=self.device)
        prox = torch.zeros((), device=self.device)
        for n, p in self.model.named_parameters():
            if n in self._anchor:
                linear = linear + (self._grad[n] * p).sum()
                prox = prox + (p - self._anchor[n]).pow(2).sum()
        return loss - linear + 0.5 * alpha * prox, {self.TASK_LOSS: loss}

    def next_state(self, fit: FitStatistics) -> State:
        alpha = self.method.alpha
        params = dict(self.model.named_parameters())
        return {"grad": {n: (g - alpha * (params[n].detach() - self._anchor[n])).cpu() for n, g in self._grad.items()}}


class FedDyn(FedAvg):
    """FedDyn: dynamic regularisation with a per-client linear term and the server state h.

    Args:
        alpha: Regularisation strength α (0.5, GGEUR's benchmark).
    """

    client_module = FedDynClient

    def client_settings(self) -> FedDynClientSettings:
        return FedDynClientSettings(self.alpha)

    def __init__(self, alpha: float = 0.5) -> None:
        super().__init__(weighting="samples")  # the buffers' average; parameters use the paper's plain mean
        if alpha <= 0:
            raise ValueError(f"FedDyn alpha must be > 0, got {alpha}")
        self.alpha = alpha

    def init_server_state(self, global_weights: Weights) -> State:
        return {"h": {}}  # zeros until the first round

    def init_client_state(self, client_id: int, global_weights: Weights) -> State:
        return {"grad": {}}

    def aggregate(
        self, round: int, global_weights: Weights, results: Sequence[ClientResult], server_state: State, ctx=None
    ) -> tuple[Weights, State]:
        """FedAvg for buffers; h and θ^t as in the module docstring for every trainable parameter."""
        new, _ = super().aggregate(round, global_weights, results, server_state)
        m = len(results)
        h = dict(server_state["h"])
        for name in self.parameter_names:
            dtype = global_weights[name].dtype
            x = global_weights[name].to(torch.float64)
            total = sum(r.weights[name].to(torch.float64) for r in results)
            prev_h = h[name].to(torch.float64) if name in h else torch.zeros_like(x)
            new_h = prev_h - self.alpha * (total - m * x) / self.num_clients
            h[name] = new_h.to(dtype)
            new[name] = (total / m - new_h / self.alpha).to(dtype)
        return new, {**server_state, "h": h}
