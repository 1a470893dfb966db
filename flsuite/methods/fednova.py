"""FedNova (Wang et al., NeurIPS 2020, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization"), normalised averaging; one of FedEGG's baselines (Tables 2-3).

Client k runs its local steps from the global weights x and uploads its weights y_k and its normalising factor
a_k = ‖a_k‖₁, the number of local steps K_k for plain SGD and, for SGD with momentum β, the effective step count
Σ_{j=1}^{K_k} (1 − β^j)/(1 − β) (the official code's `local_normalizing_vec`; `scaffold.effective_steps`).
Server, over the round's clients S with p_k = n_k / Σ_{j∈S} n_j:
    d_k = (x − y_k) / a_k,      τ_eff = Σ_k p_k a_k,      x ← x − τ_eff Σ_k p_k d_k.
When every client takes the same number of steps this is FedAvg (∝ samples) exactly in real arithmetic.

Normalisation covers the trainable parameters; buffers (e.g. BatchNorm statistics) are averaged as FedAvg.
Not implemented: the official code's server momentum (`gmf`, default 0 there, so its default run is this one) and
its proximal term in a_k (`mu`, FedNova + FedProx; the official a_k has no weight-decay term, and neither has this
one). Adam/AdamW steps are not linear in the gradient; they use a_k = K_k. With equal local work (e.g.
`local.steps`, as every FedEGG config sets) every a_k is the same and FedNova is sample-weighted FedAvg.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule, Method
from flsuite.federation.task import ClientResult, State, Weights
from flsuite.federation.weights import sample_average
from flsuite.methods.scaffold import effective_steps


class FedNovaClient(ClientModule):
    """Plain local training; uploads a_k (float64) besides the weights."""

    def upload(self, fit: FitStatistics) -> dict:
        momentum = self.local.sgd_momentum
        return {"a": torch.tensor(effective_steps(max(fit.num_steps, 1), momentum), dtype=torch.float64)}


class FedNova(Method):
    """FedNova: x ← x − τ_eff Σ p_k (x − y_k)/a_k (see the module docstring). No hyperparameters."""

    client_module = FedNovaClient

    def aggregate(
        self, round: int, global_weights: Weights, results: Sequence[ClientResult], server_state: State, ctx=None
    ) -> tuple[Weights, State]:
        new = sample_average(results)  # buffers
        n = sum(r.num_samples for r in results)
        p = [r.num_samples / n for r in results]
        a = [float(r.upload["a"]) for r in results]
        tau_eff = sum(pk * ak for pk, ak in zip(p, a))
        for name in self.parameter_names:
            x = global_weights[name].to(torch.float64)
            step = sum(pk * (x - r.weights[name].to(torch.float64)) / ak for pk, ak, r in zip(p, a, results))
            new[name] = (x - tau_eff * step).to(global_weights[name].dtype)
        return new, server_state
