"""FedFA's feature augmentation (FFA) as pure functions; the method, what travels and the docstring with the
equations and deviations are in `flsuite.methods.fedfa`.

A feature x [B, C, *S] (S: spatial dimensions, none for a feature vector, where every unit is a channel) is
normalised by its instance statistics and re-scaled by perturbed ones:
    μ_b = mean_S x_b,   σ_b = sqrt(var_S x_b + ε)                                          ∈ R^C
    Σ²_μ = var_b μ_b + ε,   Σ²_σ = var_b σ_b + ε            (client-specific statistic variances)
    γ_μ = C · r_μ / Σ_c r_μ,c,   r_μ = 1 / (1 + 1 / (Σ²_μ̄ + ε))   (Σ²_μ̄: the server's shared variance; γ_σ alike)
    β = μ + ε_μ ⊙ sqrt((γ_μ + 1) Σ²_μ),   γ = σ + ε_σ ⊙ sqrt((γ_σ + 1) Σ²_σ),   ε_μ, ε_σ ~ N(0, I)
    x̂ = γ ⊙ (x − μ) / σ + β
"""

from __future__ import annotations

from typing import Literal

import torch

#: "paper": variances over the batch (1/B) and over the clients, per channel (1/K); "official": the official code's
#: unbiased variances, the clients' one taken over all channels at once (a scalar).
VarianceForm = Literal["paper", "official"]


def spatial(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """A per-(sample, channel) tensor [B, C] shaped to broadcast over x's spatial dimensions."""
    return s.reshape(*s.shape, *([1] * (x.dim() - 2)))


def instance_statistics(x: torch.Tensor, eps: float, form: VarianceForm = "paper") -> tuple[torch.Tensor, torch.Tensor]:
    """(μ, σ) [B, C] of each sample's channels over the spatial dimensions (1/|S| variance; unbiased in the official
    form); a feature vector's channels have one position each: μ = x, σ = √ε."""
    dims = tuple(range(2, x.dim()))
    if not dims:
        return x, torch.full_like(x, eps).sqrt()
    return x.mean(dim=dims), (x.var(dim=dims, unbiased=form == "official") + eps).sqrt()


def batch_variance(s: torch.Tensor, eps: float, form: VarianceForm = "paper") -> torch.Tensor:
    """Σ² [C] of per-sample statistics [B, C] over the batch, + ε (unbiased in the official form when B > 1).

    Two passes (the mean, then the squared deviations' sum), written out: `torch.var(dim=0)` over a [16, 1280] batch
    takes 12× as long on CPU (231 µs against 18 µs) for the same value to rounding (docs/baselines.md, FedFA)."""
    n = len(s)
    deviations = s - s.mean(dim=0)
    return (deviations * deviations).sum(dim=0) / (n - 1 if form == "official" and n > 1 else n) + eps


def adaptive_weight(shared: torch.Tensor, eps: float) -> torch.Tensor:
    """γ [C] from the shared variance [C]: r = 1 / (1 + 1 / (Σ² + ε)), γ = C · r / Σ_c r_c (mean 1)."""
    r = 1 / (1 + 1 / (shared + eps))
    return len(r) * r / r.sum()


def gaussian_std(batch_var: torch.Tensor, shared: torch.Tensor, eps: float) -> torch.Tensor:
    """The Gaussian's standard deviation [C]: sqrt((γ + 1) ⊙ Σ²)."""
    return ((adaptive_weight(shared, eps) + 1) * batch_var).sqrt()


def ffa(
    x: torch.Tensor,
    shared_mean: torch.Tensor,
    shared_std: torch.Tensor,
    draw_mean: torch.Tensor,
    draw_std: torch.Tensor,
    eps: float = 1e-6,
    form: VarianceForm = "paper",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """x̂ (module docstring) with the standard-normal draws ε_μ = `draw_mean`, ε_σ = `draw_std` [B, C]; returns it and
    the statistics the client keeps: the batch means of μ and σ [C], and the mean Gaussian std of μ (a scalar).

    On a feature vector [B, C] (μ = x, σ = √ε, so x − μ = 0) x̂ is β = x + ε_μ ⊙ sqrt((γ_μ + 1) Σ²_μ), computed as
    such: the same value, one third of the general form's time with its gradient; `draw_std` is not read."""
    if x.dim() == 2:
        std_mu = gaussian_std(batch_variance(x, eps, form), shared_mean, eps)
        sigma = torch.full((x.shape[1],), eps, device=x.device, dtype=x.dtype).sqrt()
        return x + draw_mean * std_mu, {"mean": x.mean(dim=0), "std": sigma, "noise_std": std_mu.mean()}
    mu, sigma = instance_statistics(x, eps, form)
    std_mu = gaussian_std(batch_variance(mu, eps, form), shared_mean, eps)
    std_sigma = gaussian_std(batch_variance(sigma, eps, form), shared_std, eps)
    beta, gamma = mu + draw_mean * std_mu, sigma + draw_std * std_sigma
    out = (x - spatial(x, mu)) / spatial(x, sigma) * spatial(x, gamma) + spatial(x, beta)
    return out, {"mean": mu.mean(dim=0), "std": sigma.mean(dim=0), "noise_std": std_mu.mean()}


def client_variance(stats: torch.Tensor, form: VarianceForm = "paper") -> torch.Tensor:
    """The server's shared variance [C] of the clients' running statistics [K, C]: per channel over the clients
    (1/K), or in the official form one unbiased variance over every entry, repeated for each channel (0 for one
    entry)."""
    if form == "official":
        return (stats.var() if stats.numel() > 1 else torch.zeros(())).expand(stats.shape[1]).clone()
    return stats.var(dim=0, unbiased=False)
