"""GGEUR: geometry-guided embedding uncertainty representation (Ma, Dai, Huang, Chen; CVPR 2025).

A data-side setup stage (it changes what clients train on, not how they aggregate), so any FL method runs on the
augmented data by adding `setup: [{class_path: flsuite.methods.ggeur.GGEUR}]` to its config.

Protocol (paper Sec. 3, Algorithms 1 and 2; decisions from ../shared/methods/ggeur.md §8):
  1. client k, each class i it holds: n_k^i, μ_k^i and Σ_k^i = (1/n) Σ_j (x_j − μ_k^i)(x_j − μ_k^i)ᵀ (A2: centred, 1/n).
  2. server, Eq. 4: μ_i = Σ_k n_k^i μ_k^i / N_i;
         Σ_i = (Σ_k n_k^i Σ_k^i + Σ_k n_k^i (μ_k^i − μ_i)(μ_k^i − μ_i)ᵀ) / N_i
     (exactly the covariance of the pooled class-i data), eigendecomposed in float64 (A3: eigenvalues sorted
     descending, negatives clipped to 0; all p eigenpairs unless `top_k`). Sent to every client: eigenvalues and
     eigenvectors per class; multi-domain also the other domains' class prototypes (a domain's prototype is the
     n-weighted mean of its clients' μ, A7).
  3. client, Eq. 5: new samples X + Σ_m ε_m s(λ_m) ξ_m with ε ~ N(0, I), one matrix product per class.
     s(λ) = √λ by default (A1: noise covariance = Σ_i, the paper's stated goal and the official code);
     s(λ) = λ is the paper's literal formula (noise covariance Σ_i²), `eig_scale: lambda`.
     Step 1: every local class with n < T is topped up to exactly T samples: N = ⌈(T − n)/n⌉ draws around each
     original, then a random T − n of them are kept (A5); nothing is generated when n ≥ T.
     Step 2 (multi-domain only): M draws around each other-domain prototype of every class, including classes the
     client does not hold (Algorithm 2 runs per prototype). Single-domain mode generates nothing for absent classes
     (Algorithm 1 starts from existing samples; A4).
Defaults are the paper's: single-domain T = 2000; multi-domain T = 500 and M = 500 per prototype.

What leaves a client: per class it holds, n (one integer), μ (p floats) and Σ (p×p floats), in float64 here — the
answer to a client query (`ClassStatisticsQuery`), run by the run's executor and counted from the payload.
What a client receives: per class, p eigenvalues and p eigenvectors (p×p; p×k with `top_k`), and in multi-domain
mode the p-dim prototypes of the other domains' classes. Both are counted in the stage's metrics
(`setup/ggeur/bytes_up`, `bytes_down`: totals over clients).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from flsuite import progress, records
from flsuite.data.base import ClientData, DataError, FederatedData, Split
from flsuite.federation.query import ClientQuery, QueryRunner, QueryTask, ask, in_process
from flsuite.federation.setup import SetupResult, SetupStage
from flsuite.seeding import derive_seed, torch_generator

FLOAT64_BYTES = 8


@dataclass(frozen=True)
class ClassStatistics:
    """One client's summary of one class: count, mean and 1/n covariance (float64)."""

    count: int
    mean: torch.Tensor
    cov: torch.Tensor


@dataclass(frozen=True)
class Geometry:
    """A class's global geometric shape (Eq. 2): eigenvalues (descending, ≥ 0) and eigenvectors (columns)."""

    eigenvalues: torch.Tensor
    eigenvectors: torch.Tensor


def class_statistics(x: torch.Tensor) -> ClassStatistics:
    """n, μ and Σ = (1/n) Σ (x − μ)(x − μ)ᵀ of the rows of `x` (Sec. 3.1), in float64."""
    x = x.to(torch.float64)
    mean = x.mean(dim=0)
    centred = x - mean
    return ClassStatistics(x.shape[0], mean, centred.T @ centred / x.shape[0])


def tensor_sum(terms: Iterable[torch.Tensor]) -> torch.Tensor:
    """`sum(terms)` (0 + t₁ + t₂ + …), which is a tensor when there is at least one term."""
    total = sum(terms)
    if not isinstance(total, torch.Tensor):
        raise ValueError("a sum of no tensors")
    return total


def pooled_covariance(stats: Sequence[ClassStatistics]) -> ClassStatistics:
    """Eq. 4: the global mean and covariance from the clients' (n, μ, Σ); equals the pooled data's covariance."""
    stats = [s for s in stats if s.count > 0]
    if not stats:
        raise ValueError("pooled_covariance needs at least one client with samples")
    total = sum(s.count for s in stats)
    mean = tensor_sum(s.count * s.mean for s in stats) / total
    within = tensor_sum(s.count * s.cov for s in stats)
    between = tensor_sum(s.count * torch.outer(s.mean - mean, s.mean - mean) for s in stats)
    return ClassStatistics(total, mean, (within + between) / total)


def geometry(cov: torch.Tensor, top_k: int | None = None) -> Geometry:
    """Eigendecomposition in float64, eigenvalues sorted descending and clipped at 0, optionally the top k pairs."""
    values, vectors = torch.linalg.eigh(cov.to(torch.float64))
    values, vectors = values.flip(0).clamp_min(0.0), vectors.flip(1)
    if top_k is not None:
        values, vectors = values[:top_k], vectors[:, :top_k]
    return Geometry(values, vectors)


def generate(
    bases: torch.Tensor,
    shape: Geometry,
    per_base: int,
    generator: torch.Generator,
    eig_scale: Literal["sqrt", "lambda"] = "sqrt",
) -> torch.Tensor:
    """`per_base` samples around each row of `bases`: x + Σ_m ε_m s(λ_m) ξ_m (Eq. 5), as one matrix product."""
    scale = shape.eigenvalues.sqrt() if eig_scale == "sqrt" else shape.eigenvalues
    eps = torch.randn(bases.shape[0] * per_base, scale.shape[0], generator=generator, dtype=torch.float64)
    noise = (eps * scale) @ shape.eigenvectors.T
    return bases.to(torch.float64).repeat_interleave(per_base, dim=0) + noise


def similarity(a: Geometry, b: Geometry, top: int = 5) -> float:
    """Eq. 3: S = Σ_{i ≤ top} |⟨ξ_a^i, ξ_b^i⟩|, eigenvectors paired by rank; in [0, top] (the paper uses top 5)."""
    return float((a.eigenvectors[:, :top] * b.eigenvectors[:, :top]).sum(dim=0).abs().sum())


class GGEUR(SetupStage):
    """GGEUR augmentation as a setup stage (see the module docstring for the protocol and decisions).

    Args:
        mode: "single" (label skew: Algorithm 1), "multi" (domain skew: Algorithm 2, Steps 1 and 2), or "auto"
            (multi when the federation has more than one domain).
        target_per_class: Step 1 tops every local class up to this many samples (originals + generated);
            null = the paper's 2000 (single) or 500 (multi).
        samples_per_prototype: Step 2 draws this many samples around each other-domain prototype (paper: 500).
        step2: Run Step 2 in multi-domain mode (false = the "Step 1" ablation of Table 4).
        eig_scale: "sqrt" (noise covariance Σ, default) or "lambda" (the paper's literal λ scaling, covariance Σ²).
        top_k: Use only the top-k eigenpairs (also shrinks what the server sends); null = all p.
    """

    def __init__(
        self,
        mode: Literal["auto", "single", "multi"] = "auto",
        target_per_class: int | None = None,
        samples_per_prototype: int = 500,
        step2: bool = True,
        eig_scale: Literal["sqrt", "lambda"] = "sqrt",
        top_k: int | None = None,
    ) -> None:
        if mode not in ("auto", "single", "multi"):
            raise ValueError(f"GGEUR mode must be auto, single or multi, got {mode!r}")
        if eig_scale not in ("sqrt", "lambda"):
            raise ValueError(f"GGEUR eig_scale must be sqrt or lambda, got {eig_scale!r}")
        if target_per_class is not None and target_per_class < 1:
            raise ValueError(f"GGEUR target_per_class must be >= 1 or null, got {target_per_class}")
        if samples_per_prototype < 0:
            raise ValueError(f"GGEUR samples_per_prototype must be >= 0, got {samples_per_prototype}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"GGEUR top_k must be >= 1 or null, got {top_k}")
        self.mode, self.target_per_class, self.samples_per_prototype = mode, target_per_class, samples_per_prototype
        self.step2, self.eig_scale, self.top_k = step2, eig_scale, top_k

    def resolved_mode(self, data: FederatedData) -> Literal["single", "multi"]:
        if self.mode != "auto":
            return self.mode
        return "multi" if len(data.domains) > 1 else "single"

    def run(self, data: FederatedData, seed: int, query: QueryRunner | None = None) -> SetupResult:
        if data.clients[0].train.x.ndim != 2:
            raise DataError(
                "GGEUR works on embedding vectors [N, p]; "
                f"the clients hold inputs of shape {list(data.input_shape)} (set data.encoder)"
            )
        multi = self.resolved_mode(data) == "multi"
        target = self.target_per_class or (500 if multi else 2000)
        p = data.input_shape[0]
        k = self.top_k or p
        generated: list[list[torch.Tensor]] = [[] for _ in data.clients]
        labels: list[list[torch.Tensor]] = [[] for _ in data.clients]
        bytes_up = bytes_down = 0
        query = query or in_process(data)
        client_ids = [client.client_id for client in data.clients]
        for c in progress.track(range(data.num_classes), "GGEUR", "class"):  # Eq. 4 and 5, class by class
            held = {client.client_id: client.train.x[client.train.y == c] for client in data.clients}
            answers = ask(
                query, ClassStatisticsQuery(c), client_ids, lambda k: derive_seed(seed, client=k, purpose="ggeur/stats")
            )
            bytes_up += answers.bytes_up
            stats = {
                cid: ClassStatistics(int(u["count"]), u["mean"], u["cov"]) for cid, u in answers.uploads().items() if u
            }
            if not stats:
                continue
            shape = geometry(pooled_covariance(list(stats.values())).cov, self.top_k)
            bytes_down += len(data.clients) * (k + p * k) * FLOAT64_BYTES
            prototypes = _domain_prototypes(data, stats) if multi and self.step2 else {}
            for client in data.clients:
                gen = torch_generator(seed, client=client.client_id, purpose=f"ggeur/class{c}")
                own = held[client.client_id]
                parts = []
                if 0 < len(own) < target:  # Step 1
                    per_base = math.ceil((target - len(own)) / len(own))
                    drawn = generate(own, shape, per_base, gen, self.eig_scale)
                    parts.append(drawn[torch.randperm(len(drawn), generator=gen)[: target - len(own)]])
                others = [proto for domain, proto in prototypes.items() if domain != client.domain]
                if others and self.samples_per_prototype:  # Step 2
                    bytes_down += len(others) * p * FLOAT64_BYTES
                    parts.append(generate(torch.stack(others), shape, self.samples_per_prototype, gen, self.eig_scale))
                if parts:
                    new = torch.cat(parts).to(client.train.x.dtype)
                    generated[client.client_id].append(new)
                    labels[client.client_id].append(torch.full((len(new),), c, dtype=torch.long))
        clients = []
        for client in data.clients:
            x = torch.cat([client.train.x, *generated[client.client_id]])
            y = torch.cat([client.train.y, *labels[client.client_id]])
            clients.append(ClientData(client.client_id, client.domain, Split(x, y)))
        n_generated = sum(len(t) for parts in generated for t in parts)
        description = {**data.description, "ggeur": {"mode": "multi" if multi else "single", "generated": n_generated}}
        augmented = FederatedData(clients, data.test, data.num_classes, data.classes, description, data.validation)
        metrics: dict[str, float | int] = {
            records.BYTES_UP: bytes_up,  # setup/ggeur/bytes_up: what `records.query_totals` adds up
            records.BYTES_DOWN: bytes_down,
            "generated": n_generated,
            "multi_domain": int(multi),
            "target_per_class": target,
        }
        sent = f"{bytes_up / 2**20:,.1f} MiB up, {bytes_down / 2**20:,.1f} MiB down"
        return SetupResult(
            augmented,
            metrics,
            f"{n_generated:,} embeddings generated ({'multi' if multi else 'single'}-domain, T = {target}; {sent})",
        )


class ClassStatisticsQuery(ClientQuery):
    """Step 1 of the protocol on one client: (n, μ, Σ) of its samples of class `cls` (float64; n as an int64
    scalar), or nothing when it holds none. Exactly this leaves the client."""

    name = "ggeur/class_stats"

    def __init__(self, cls: int) -> None:
        self.cls = cls

    def compute(self, client: ClientData, task: QueryTask, model: torch.nn.Module | None) -> dict[str, torch.Tensor]:
        x = client.train.x[client.train.y == self.cls]
        if len(x) == 0:
            return {}
        s = class_statistics(x)
        return {"count": torch.tensor(s.count, dtype=torch.int64), "mean": s.mean, "cov": s.cov}


def _domain_prototypes(data: FederatedData, stats: dict[int, ClassStatistics]) -> dict[str, torch.Tensor]:
    """Each domain's class prototype: the n-weighted mean of its clients' μ (A7); domains without the class skipped."""
    by_domain: dict[str, list[ClassStatistics]] = {}
    for cid, s in stats.items():
        by_domain.setdefault(data.clients[cid].domain, []).append(s)
    return {d: tensor_sum(s.count * s.mean for s in ss) / sum(s.count for s in ss) for d, ss in by_domain.items()}
