"""FedOpt (Reddi et al., ICLR 2021, "Adaptive Federated Optimization"): a server optimiser on the pseudo-gradient.

Round t: clients train locally from x_t as FedAvg; the server forms the pseudo-gradient
    Δ_t = x_t − avg_k(x_k)            (avg ∝ client sample count, as FedAvg)
and takes one optimiser step on it (descent, Δ plays the role of a gradient):
    SGD:   m ← β m + Δ;                              x ← x − η_g m        (β = `momentum`; η_g = 1, β = 0 is FedAvg)
    Adam:  m ← β1 m + (1 − β1) Δ;  v ← β2 v + (1 − β2) Δ²;               x ← x − η_g m / (√v + τ)
    Yogi:  m as Adam;              v ← v − (1 − β2) Δ² sign(v − Δ²);     x ← x − η_g m / (√v + τ)
Adam/Yogi follow Reddi et al.'s Algorithm 2: no bias correction, v starts at τ².

Only trainable parameters get the server step; buffers (e.g. BatchNorm statistics) are averaged as FedAvg.
The moments m, v are server state (tensors, checkpointed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from flsuite.federation.task import ClientResult, State, Weights
from flsuite.methods.fedavg import FedAvg


class FedOpt(FedAvg):
    """FedOpt: FedAvg's local training, then a server optimiser step on Δ = w_global − avg_k(w_k).

    Args:
        server: Server optimiser: "sgd" (FedAvgM when momentum > 0), "adam" (FedAdam) or "yogi" (FedYogi).
        server_lr: Server learning rate η_g (0.5, as GGEUR's benchmark code, §8 A19).
        momentum: Server SGD momentum β (SGD only).
        beta1: First-moment decay β1 (Adam/Yogi).
        beta2: Second-moment decay β2 (Adam/Yogi).
        tau: Adaptivity τ (Adam/Yogi): added to √v, and v's initial value is τ².
        weighting: How the client models are averaged before Δ is formed: "samples" or "uniform".
    """

    def __init__(
        self,
        server: Literal["sgd", "adam", "yogi"] = "sgd",
        server_lr: float = 0.5,
        momentum: float = 0.0,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        super().__init__(weighting=weighting)
        if server not in ("sgd", "adam", "yogi"):
            raise ValueError(f"FedOpt server must be sgd, adam or yogi, got {server!r}")
        if server_lr <= 0 or tau <= 0 or not 0 <= momentum < 1 or not 0 <= beta1 < 1 or not 0 <= beta2 < 1:
            raise ValueError("FedOpt needs server_lr > 0, tau > 0 and momentum, beta1, beta2 in [0, 1)")
        self.server, self.server_lr, self.momentum = server, server_lr, momentum
        self.beta1, self.beta2, self.tau = beta1, beta2, tau

    def init_server_state(self, global_weights: Weights) -> State:
        return {"m": {}, "v": {}}

    def aggregate(
        self, round: int, global_weights: Weights, results: Sequence[ClientResult], server_state: State, ctx=None
    ) -> tuple[Weights, State]:
        """FedAvg's average, then the server optimiser step on every trainable parameter."""
        new, _ = super().aggregate(round, global_weights, results, server_state)
        m, v = dict(server_state["m"]), dict(server_state["v"])
        for name in self.parameter_names:
            dtype = global_weights[name].dtype
            x = global_weights[name].to(torch.float64)
            delta = x - new[name].to(torch.float64)  # pseudo-gradient x_t − avg
            if self.server == "sgd":
                step = delta if name not in m else self.momentum * m[name].to(torch.float64) + delta
                mom = step
            else:
                mom = (1 - self.beta1) * delta
                if name in m:
                    mom = mom + self.beta1 * m[name].to(torch.float64)
                prev_v = v[name].to(torch.float64) if name in v else torch.full_like(delta, self.tau**2)
                d2 = delta.pow(2)
                if self.server == "adam":
                    var = self.beta2 * prev_v + (1 - self.beta2) * d2
                else:
                    var = prev_v - (1 - self.beta2) * d2 * torch.sign(prev_v - d2)
                v[name] = var.to(dtype)
                step = mom / (var.sqrt() + self.tau)
            m[name] = mom.to(dtype)
            new[name] = (x - self.server_lr * step).to(dtype)
        return new, {**server_state, "m": m, "v": v}
