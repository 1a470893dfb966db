"""FedCiR's client loss as separate terms: L_align's batch reduction, the terms' statistics per step, and their
gradient shares once per fit (what `client/fedcir/*` logs; docs/fedcir.md, "What the logs mean").

For each weighted term t that is on in a fit (λ_t > 0 and its broadcast received: from round 2), per client:
    <t>                the unweighted term (`reg`: L_reg, Eq. 12; `align`: L_align, Eq. 14 under `kl_reduction`),
                       mean over the fit's steps; `ce` (L_fl's batch CE, the FL-task loss) likewise, always
    <t>_loss_share     λ_t L_t / L, L the whole local loss, mean over the fit's steps
    <t>_grad_vs_ce     ‖∇_θ λ_t L_t‖ / ‖∇_θ L_CE‖ over the model's trainable parameters θ, on the fit's first batch at
                       its starting weights (`ClientModule.probe`: three backward passes once per fit, not per step)
The round's record holds their sample-weighted means over the clients.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule, LocalLoss, S

#: L_align's reduction over the batch (`FedCiR.kl_reduction`).
KLReduction = Literal["batch_mean", "batch_sum"]
KL_REDUCTIONS: tuple[KLReduction, ...] = ("batch_mean", "batch_sum")
#: The weighted terms, in the order they are reported.
TERMS = ("reg", "align")


def reduce_kl(kl: torch.Tensor, reduction: KLReduction) -> torch.Tensor:
    """L_align from the per-sample KLs [B] (each summed over d, Eq. 17): "batch_mean" (1/B) Σ_i, Eq. 14's expectation
    (spec §1.3, §7.1; FedSR's code); "batch_sum" Σ_i = B × batch_mean, the scale λ_align = 5e-6 implies: at the
    ≈ 230 nats per sample measured here, λ·L_align ≈ 1.2e-3 (batch_mean) vs ≈ 0.037 (batch_sum, B = 32)."""
    if reduction == "batch_mean":
        return kl.mean()
    if reduction == "batch_sum":
        return kl.sum()
    raise ValueError(f"FedCiR kl_reduction must be one of {', '.join(map(repr, KL_REDUCTIONS))}, got {reduction!r}")


def total_loss(terms: Mapping[str, torch.Tensor], weights: Mapping[str, float]) -> torch.Tensor:
    """L = L_CE + Σ_t λ_t L_t, added in the order of `weights` (the same operations as a hand-written sum)."""
    loss = terms["ce"]
    for t, lam in weights.items():
        loss = loss + lam * terms[t]
    return loss


def term_statistics(
    terms: Mapping[str, torch.Tensor], weights: Mapping[str, float], loss: torch.Tensor, task_loss: str
) -> dict[str, torch.Tensor]:
    """One step's statistics: L_CE under `task_loss` (`ClientModule.TASK_LOSS`), each on term t and λ_t L_t / L."""
    on = [t for t in TERMS if t in weights]
    return {
        task_loss: terms["ce"],
        **{t: terms[t] for t in on},
        **{f"{t}_loss_share": weights[t] * terms[t] / loss for t in on},
    }


def _grad_norm(value: torch.Tensor, params: Sequence[torch.Tensor]) -> torch.Tensor:
    grads = torch.autograd.grad(value, list(params), retain_graph=True, allow_unused=True)
    return torch.sqrt(
        sum((g.double().pow(2).sum() for g in grads if g is not None), torch.zeros((), dtype=torch.float64))
    )


def gradient_shares(
    terms: Mapping[str, torch.Tensor], weights: Mapping[str, float], params: Sequence[torch.Tensor]
) -> dict[str, float]:
    """‖∇ λ_t L_t‖ / ‖∇ L_CE‖ for each on term t (float64 norms; `.grad` untouched)."""
    ce = _grad_norm(terms["ce"], params)
    return {f"{t}_grad_vs_ce": float(_grad_norm(weights[t] * terms[t], params) / ce) for t in TERMS if t in weights}


class TermsClient(ClientModule[S]):
    """A client whose loss is L = L_CE + Σ_t λ_t L_t over the terms `terms(x, y)` returns, that reports each term
    (module docstring). A subclass sets, in `begin`, `weights` {t: λ_t} of the terms on in the fit (in the order
    they are added) and `reports` (False: the plain loss, no statistics, nothing reported), then calls `start_terms`."""

    weights: dict[str, float]
    reports: bool

    def terms(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def start_terms(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}  # float64, on their device: no sync per step
        self._gathered, self._shares = 0, dict[str, float]()

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> LocalLoss:
        terms = self.terms(x, y)
        loss = total_loss(terms, self.weights)
        return (loss, term_statistics(terms, self.weights, loss, self.TASK_LOSS)) if self.reports else loss

    def gather(self, statistics: dict[str, torch.Tensor]) -> None:
        for k, v in statistics.items():
            self._sums[k] = v.double() if k not in self._sums else self._sums[k] + v.double()
        self._gathered += 1

    def probe(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """The gradient shares, at the fit's starting weights on its first batch (the same draws as its first step)."""
        if self.reports and self.weights:
            self._shares = gradient_shares(
                self.terms(x, y), self.weights, [p for p in self.model.parameters() if p.requires_grad]
            )

    def metrics(self, fit: FitStatistics) -> dict[str, float]:
        if not self.reports:
            return {}
        return {
            "ce": fit.mean_task_loss,
            **{k: float(s) / self._gathered for k, s in self._sums.items()},
            **self._shares,
        }
