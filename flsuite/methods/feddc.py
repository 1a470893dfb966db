"""FedDC (Gao et al., CVPR 2022, "FedDC: Federated Learning with Non-IID Data via Local Drift Decoupling and
Correction"), in the form of its official code (gaoliang13/FedDC); one of FedEGG's baselines (Tables 2-3).

Client k keeps a local drift h_k and a gradient state c_k (zeros at first); the server keeps c and the mean drift h̄ =
(1/N) Σ_{all k} h_k (it can, since it receives every θ_k). In round t, from the global weights w, client k minimises
    L_k(θ) + α/2 ‖θ − (w − h_k)‖² + ⟨θ, c − c_k⟩
for K local steps at rate η, then, with Δ_k = θ_k − w:
    h_k ← h_k + Δ_k,      c_k⁺ = c_k − c − Δ_k / (K η)            (as SCAFFOLD's option II)
and uploads θ_k and Δc_k = c_k⁺ − c_k (two parameter sets: the paper's doubled upload, counted in `bytes_up`).
η in c_k⁺ is the base learning rate (official: `beta = 1/n_minibatch/learning_rate`, the undecayed rate; `drift_lr:
current` divides by the round's rate instead, 1000× larger after FedEGG's ×0.001 drop), and every step's gradient is
clipped to norm 10 before the optimiser step (official `max_norm = 10`; `clip_norm: null` turns it off).
Server, over the round's clients S of N:
    c ← c + (1/N) Σ_{k∈S} Δc_k,    h̄ ← h̄ + (1/N) Σ_{k∈S} Δ_k,    w ← (1/|S|) Σ_{k∈S} θ_k + h̄
(the paper's w = mean_k(θ_k + h_k) under full participation).

Decisions: uniform client weights (the official code scales α and c by n̄/n_k, 1 for equal-size clients); with SGD
momentum the divisor is the effective step count (`scaffold.effective_steps`, as the suite's SCAFFOLD). The drift,
correction and states cover the trainable parameters; buffers are averaged as FedAvg (∝ client sample count).
In round 1 (h_k = c = c_k = 0) the clients are exactly FedProx's with μ = α where the clipping does not act.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule, Method
from flsuite.federation.task import ClientResult, State, Weights
from flsuite.federation.weights import sample_average
from flsuite.methods.scaffold import effective_steps


@dataclass(frozen=True)
class FedDCClientSettings:
    """What FedDC's clients read (see `FedDC`)."""

    alpha: float
    drift_lr: Literal["base", "current"]
    clip_norm: float | None


class FedDCClient(ClientModule[FedDCClientSettings]):
    """CE + α/2‖θ − (w − h_k)‖² + ⟨θ, c − c_k⟩; gradients clipped to `clip_norm`; updates h_k and c_k after local
    training."""

    step_hooks = True  # the gradient clipping

    def begin(self) -> None:
        h: dict[str, torch.Tensor] = self.task.state.get("h", {})
        c_k: dict[str, torch.Tensor] = self.task.state.get("c_k", {})
        c: dict[str, torch.Tensor] = self.task.broadcast.get("c", {})
        self._anchor, self._h, self._c, self._c_k = {}, {}, {}, {}
        for n, p in self.model.named_parameters():
            if p.requires_grad:
                zeros = torch.zeros_like(p.detach())
                self._anchor[n] = self.task.global_weights[n].detach().to(self.device, copy=True)
                self._h[n] = h[n].to(self.device) if n in h else zeros
                self._c[n] = c[n].to(self.device) if n in c else zeros
                self._c_k[n] = c_k[n].to(self.device) if n in c_k else zeros
        self._target = {n: self._anchor[n] - self._h[n] for n in self._anchor}
        self._correction = {n: self._c[n] - self._c_k[n] for n in self._anchor}
        self._corrected = any(bool(v.any()) for v in self._correction.values())
        self._trainable = [p for p in self.model.parameters() if p.requires_grad]

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ce = F.cross_entropy(self.model(x), y)
        params = [(n, p) for n, p in self.model.named_parameters() if n in self._anchor]
        prox = sum((p - self._target[n]).pow(2).sum() for n, p in params)
        loss = ce + 0.5 * self.method.alpha * prox
        if self._corrected:  # ⟨θ, 0⟩ adds nothing: skipped, so round 1 is FedProx's step for step
            loss = loss + sum((p * self._correction[n]).sum() for n, p in params)
        return loss, {self.TASK_LOSS: ce}

    def before_optimizer_step(self) -> None:
        if self.method.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(self._trainable, self.method.clip_norm)

    def end(self, fit: FitStatistics) -> None:
        momentum = self.local.sgd_momentum
        lr = self.local.lr if self.method.drift_lr == "base" else self.local.lr_at(self.task.round)
        scale = 1.0 / (effective_steps(max(fit.num_steps, 1), momentum) * lr)
        params = dict(self.model.named_parameters())
        self._new_h, self._new_c_k, self._delta_c = {}, {}, {}
        for n in self._anchor:
            delta = params[n].detach() - self._anchor[n]
            c_plus = self._c_k[n] - self._c[n] - delta * scale
            self._new_h[n] = (self._h[n] + delta).cpu()
            self._new_c_k[n] = c_plus.cpu()
            self._delta_c[n] = (c_plus - self._c_k[n]).cpu()

    def upload(self, fit: FitStatistics) -> dict:
        return {"delta_c": self._delta_c}

    def next_state(self, fit: FitStatistics) -> State:
        return {"h": self._new_h, "c_k": self._new_c_k}


class FedDC(Method):
    """FedDC: local drift decoupling (h_k, α) and gradient correction (c, c_k).

    Args:
        alpha: Weight α of the drift penalty (official code: 0.01 for CIFAR).
        drift_lr: The η dividing Δ_k in c_k⁺: "base" (`local.lr`, the official code) or "current" (the round's
            scheduled rate, this suite's form before issue 23).
        clip_norm: Clip each step's gradient (trainable parameters) to this norm (official: 10); null: no clipping.
    """

    client_module = FedDCClient

    def client_settings(self) -> FedDCClientSettings:
        return FedDCClientSettings(self.alpha, self.drift_lr, self.clip_norm)

    def __init__(
        self, alpha: float = 0.01, drift_lr: Literal["base", "current"] = "base", clip_norm: float | None = 10.0
    ) -> None:
        if alpha < 0:
            raise ValueError(f"FedDC alpha must be >= 0, got {alpha}")
        if drift_lr not in ("base", "current"):
            raise ValueError(f"FedDC drift_lr must be 'base' or 'current', got {drift_lr!r}")
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"FedDC clip_norm must be > 0 or null, got {clip_norm}")
        self.alpha, self.drift_lr, self.clip_norm = alpha, drift_lr, clip_norm

    def init_server_state(self, global_weights: Weights) -> State:
        return {"c": {}, "h": {}}  # zeros until the first round

    def init_client_state(self, client_id: int, global_weights: Weights) -> State:
        return {"h": {}, "c_k": {}}

    def broadcast(self, round: int, server_state: State) -> dict:
        return {"c": server_state["c"]}

    def aggregate(
        self, round: int, global_weights: Weights, results: Sequence[ClientResult], server_state: State, ctx=None
    ) -> tuple[Weights, State]:
        new = sample_average(results)  # buffers
        m, num_clients = len(results), self.num_clients
        c, h = dict(server_state["c"]), dict(server_state["h"])
        for name in self.parameter_names:
            dtype = global_weights[name].dtype
            x = global_weights[name].to(torch.float64)
            total = sum(r.weights[name].to(torch.float64) for r in results)
            prev_h = h[name].to(torch.float64) if name in h else torch.zeros_like(x)
            new_h = prev_h + (total - m * x) / num_clients
            prev_c = c[name].to(torch.float64) if name in c else torch.zeros_like(x)
            c[name] = (prev_c + sum(r.upload["delta_c"][name].to(torch.float64) for r in results) / num_clients).to(
                dtype
            )
            h[name] = new_h.to(dtype)
            new[name] = (total / m + new_h).to(dtype)
        return new, {**server_state, "c": c, "h": h}
