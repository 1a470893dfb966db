"""The conditional feature generator FedCiR and FedGen train on the server, and its loss (FedCiR spec §1.4, [OURS]
sizes): z = G(y, ε) = W₂ ReLU(BN(W₁ [ε, onehot(y)] + b₁)) + b₂, ε ∈ R^{noise_dim}.
Server loss over a batch of (ε_i, y_i), y_i uniform over the allowed classes, with a_{k,i} = A[k, y_i] the ensemble
coefficient of client k (A: [K, C]) and h_k(z) = W_k z + b_k client k's uploaded linear head:
    "logits"     (FedCiR default)          CE(Σ_k a_{k,i} h_k(z_i), y_i)
    "mixture"    (FedCiR option)           −log Σ_k a_{k,i} softmax(h_k(z_i))_{y_i}
    "per_client" (FedGen; FedCiR option)   Σ_k a_{k,i} CE(h_k(z_i), y_i)   (each client's loss, weighted)
plus η · exp(−mean_{i,j} ‖ε_i − ε_j‖²/q · ‖z_i − z_j‖₁/d) (FedGen's diversity loss; η = 0 in FedCiR).
Every client head of the round enters through A (a public FedGen variant collapses the ensemble to the global head;
`tests/methods/test_fedcir.py` checks that perturbing one uploaded head changes the generator's update). With the
same a_k for every label (FedCiR's α_k) "logits" equals the CE of the α-averaged head, Σ_k α_k (W_k z + b_k) = W̄ z + b̄
(an identity of linear heads); "mixture" and "per_client" do not (`tests/methods/test_fedcir_terms.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from flsuite.federation.task import Weights
from flsuite.seeding import seed_torch

Ensemble = Literal["logits", "mixture", "per_client"]
Noise = Literal["normal", "uniform"]


def draw_noise(
    n: int, dim: int, kind: Noise, generator: torch.Generator | None = None, device: Any = None
) -> torch.Tensor:
    """Generator noise: N(0, I) (FedCiR) or U[0, 1) (FedGen's official code)."""
    fn = torch.randn if kind == "normal" else torch.rand
    return fn(n, dim, generator=generator, device=device)


class ConditionalGenerator(nn.Module):
    """G(y, ε): Linear(noise_dim + C, hidden) → BatchNorm1d → ReLU → Linear(hidden, dim)."""

    def __init__(self, num_classes: int, dim: int, noise_dim: int = 32, hidden: int = 256) -> None:
        super().__init__()
        self.num_classes, self.noise_dim = num_classes, noise_dim
        self.net = nn.Sequential(
            nn.Linear(noise_dim + num_classes, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, dim)
        )

    def forward(self, y: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([eps, F.one_hot(y, self.num_classes).to(eps.dtype)], dim=1))


def build_generator(
    num_classes: int, dim: int, noise_dim: int, hidden: int, seed: int | None = None
) -> ConditionalGenerator:
    """A generator built without moving the caller's global RNG; with `seed`, its initial weights come from it."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            seed_torch(seed)
        return ConditionalGenerator(num_classes, dim, noise_dim, hidden)


def frozen_generator(
    weights: Weights, num_classes: int, dim: int, noise_dim: int, hidden: int, device: Any
) -> ConditionalGenerator:
    """The broadcast generator on a client: eval mode (BN running statistics), no gradients (spec §7.5)."""
    gen = build_generator(num_classes, dim, noise_dim, hidden)
    gen.load_state_dict(weights)
    gen.to(device).eval()
    for p in gen.parameters():
        p.requires_grad_(False)
    return gen


def ensemble_loss(
    z: torch.Tensor,
    y: torch.Tensor,
    heads: Sequence[tuple[torch.Tensor, torch.Tensor]],
    coef: torch.Tensor,
    mode: Ensemble,
) -> torch.Tensor:
    """The generator's ensemble loss (module docstring); `coef` [K, C]."""
    a = coef[:, y]  # [K, B]
    logits = torch.stack([F.linear(z, w, b) for w, b in heads])  # [K, B, C]
    if mode == "logits":
        return F.cross_entropy((a[..., None] * logits).sum(0), y)
    if mode == "mixture":
        logp = torch.logsumexp(
            torch.log(a.clamp_min(1e-30))
            + F.log_softmax(logits, -1).gather(-1, y.expand(len(heads), -1)[..., None])[..., 0],
            0,
        )
        return -logp.mean()
    if mode == "per_client":
        ce = torch.stack([F.cross_entropy(client_logits, y, reduction="none") for client_logits in logits])  # [K, B]
        return (a * ce).sum(0).mean()
    raise ValueError(f"unknown generator ensemble {mode!r} (logits, mixture or per_client)")


def diversity_loss(eps: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """FedGen's diversity loss: exp(−mean(noise distance (mean squared) × output distance (mean absolute)))."""
    noise_dist = (eps[:, None] - eps[None]).pow(2).mean(-1)
    out_dist = (z[:, None] - z[None]).abs().mean(-1)
    return torch.exp(-(noise_dist * out_dist).mean())
