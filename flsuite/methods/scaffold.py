"""SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates.

Client k in round t starts from y = x (global weights), with server control variate c and its own c_k (zeros at
first), and corrects every local gradient:   y ← y − η_l (g_k(y) − c_k + c).
After K local steps:   c_k⁺ = c_k − c + (x − y) / (K η_l)          (option II)
It uploads Δy_k = y − x and Δc_k = c_k⁺ − c_k (2|θ| numbers, `bytes_up`), and keeps c_k⁺.
Server, over the round's clients S of N:   x ← x + η_g · mean_{k∈S} Δy_k,   c ← c + (|S|/N) · mean_{k∈S} Δc_k.

Control variates exist for the trainable parameters only; buffers (e.g. BatchNorm statistics) travel and are
averaged as FedAvg (∝ client sample count). The clients' parameters themselves never reach the server
(`weights_up = "buffers"`: the engine sends only the floating-point buffers with the upload), and entries that do
not travel (integer buffers such as `num_batches_tracked`) keep the server's value.

Option II assumes plain SGD steps y ← y − η_l g, so that (x − y)/(K η_l) is the mean corrected gradient. The
papers' local optimiser is SGD with momentum β = 0.9 (heavy ball, torch's buffer m_k = β m_{k−1} + g_k), whose K
steps move y by η_l Σ_k m_k = η_l Σ_j g_j (1 − β^{K−j+1})/(1 − β): the textbook formula then returns c_k⁺ inflated
by ≈ 1/(1 − β) = 10×, the correction (c − c_k) is 10× too strong and, on digits_offline with the GGEUR settings,
the global model diverged from round 2 (train loss 9e2 at round 4, non-finite at round 40). The suite therefore
divides by the *effective* number of steps, K_eff = Σ_{k=1}^{K} (1 − β^k)/(1 − β), which is exact for a constant
gradient and equals K when β = 0 (`effective_steps: false` restores the textbook K η_l for any optimiser). Adam/AdamW
steps are not linear in the gradient; they use K.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule, Method
from flsuite.federation.task import ClientResult, State, Weights
from flsuite.federation.weights import sample_average


def effective_steps(steps: int, momentum: float) -> float:
    """K_eff = Σ_{k=1}^{K} (1 − β^k)/(1 − β) = (K − β(1 − β^K)/(1 − β))/(1 − β): K heavy-ball SGD steps on a constant
    gradient g move the weights by η_l · K_eff · g (K_eff = K when β = 0)."""
    if momentum == 0:
        return float(steps)
    b = momentum
    return (steps - b * (1 - b**steps) / (1 - b)) / (1 - b)


@dataclass(frozen=True)
class ScaffoldClientSettings:
    """What SCAFFOLD's clients read (see `Scaffold`)."""

    effective_steps: bool


class ScaffoldClient(ClientModule[ScaffoldClientSettings]):
    """Adds (c − c_k) to each trainable parameter's gradient; computes c_k⁺ (option II) after local training."""

    def begin(self) -> None:
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        server_c: dict[str, torch.Tensor] = self.task.broadcast.get("c", {})
        own_c: dict[str, torch.Tensor] = self.task.state.get("c_i", {})
        zeros = {n: torch.zeros_like(p) for n, p in params.items()}
        self._c = {n: server_c[n].to(self.device) if n in server_c else zeros[n] for n in params}
        self._c_i = {n: own_c[n].to(self.device) if n in own_c else zeros[n] for n in params}
        self._correction = {n: self._c[n] - self._c_i[n] for n in params}
        self._upload: dict[str, dict[str, torch.Tensor]] = {}
        self._new_c_i: dict[str, torch.Tensor] = {}

    def gradient_offset(self) -> dict[str, torch.Tensor]:
        return self._correction

    def end(self, fit: FitStatistics) -> None:
        scale = 1.0 / (self.steps_taken(fit.num_steps) * self.local.lr_at(self.task.round))
        delta_y, delta_c, new_c_i = {}, {}, {}
        for n, p in self.model.named_parameters():
            if n not in self._correction:
                continue
            x = self.task.global_weights[n].to(self.device)
            y = p.detach()
            c_plus = self._c_i[n] - self._c[n] + (x - y) * scale
            delta_y[n] = (y - x).cpu()
            delta_c[n] = (c_plus - self._c_i[n]).cpu()
            new_c_i[n] = c_plus.cpu()
        self._upload = {"delta_y": delta_y, "delta_c": delta_c}
        self._new_c_i = new_c_i

    def steps_taken(self, num_steps: int) -> float:
        """K (textbook) or K_eff for SGD with momentum after `num_steps` steps: the divisor of (x − y)/η_l in option
        II."""
        steps = max(num_steps, 1)
        momentum = self.local.sgd_momentum
        return effective_steps(steps, momentum) if self.method.effective_steps else float(steps)

    def upload(self, fit: FitStatistics) -> dict:
        return self._upload

    def next_state(self, fit: FitStatistics) -> State:
        return {"c_i": self._new_c_i}


class Scaffold(Method):
    """SCAFFOLD with option-II control variates.

    Args:
        server_lr: Global step size η_g in x ← x + η_g · mean(Δy) (0.25: GGEUR's Table 9; 1.0 is the paper's default
            and, with zero control variates, makes round 1 equal FedAvg with uniform weights).
        effective_steps: Divide (x − y)/η_l by the effective step count K_eff of SGD with momentum (see the module
            docstring; the suite's default, a recorded deviation) rather than by K (the textbook formula).
    """

    client_module = ScaffoldClient

    def client_settings(self) -> ScaffoldClientSettings:
        return ScaffoldClientSettings(self.effective_steps)

    def __init__(self, server_lr: float = 0.25, effective_steps: bool = True) -> None:
        if server_lr <= 0:
            raise ValueError(f"SCAFFOLD server_lr must be > 0, got {server_lr}")
        self.server_lr = server_lr
        self.effective_steps = effective_steps

    def init_server_state(self, global_weights: Weights) -> State:
        return {"c": {}}  # zeros until the first round (clients treat a missing entry as zero)

    def init_client_state(self, client_id: int, global_weights: Weights) -> State:
        return {"c_i": {}}

    def broadcast(self, round: int, server_state: State) -> dict:
        return {"c": server_state["c"]}

    #: Up: Δy and Δc for every trainable parameter (2|θ|, the upload), plus the buffers averaged as FedAvg (e.g.
    #: BatchNorm statistics); the full weights are not sent.
    weights_up = "buffers"

    def aggregate(
        self, round: int, global_weights: Weights, results: Sequence[ClientResult], server_state: State, ctx=None
    ) -> tuple[Weights, State]:
        # the buffers that came (floating point): FedAvg, the rest the server's; parameters: x + η_g mean(Δy)
        new = {**global_weights, **sample_average(results)}
        m = len(results)
        num_clients = self.num_clients
        c = dict(server_state["c"])
        for name in results[0].upload["delta_y"]:
            mean_dy = sum(r.upload["delta_y"][name].to(torch.float64) for r in results) / m
            x = global_weights[name]
            new[name] = (x.to(torch.float64) + self.server_lr * mean_dy).to(x.dtype)
            mean_dc = sum(r.upload["delta_c"][name].to(torch.float64) for r in results) / m
            prev = c[name].to(torch.float64) if name in c else torch.zeros_like(mean_dc)
            c[name] = (prev + (m / num_clients) * mean_dc).to(x.dtype)
        return new, {**server_state, "c": c}
