"""What FedCiR and FedGen share: a server-trained conditional feature generator over the round's client heads, and
the closed-form Gaussian KL that FedCiR's L_align and FedSR's conditional-MI term use.

Generator (FedCiR spec §1.4, [OURS] sizes): z = G(y, ε) = W₂ ReLU(BN(W₁ [ε, onehot(y)] + b₁)) + b₂, ε ∈ R^{noise_dim}.
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
Training is E_g Adam steps per round as a server-side Lightning fit (`ServerContext.fit`); the generator and its Adam
moments are kept across rounds in the server state. Its noise and labels come from the derived server stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from flsuite.data.base import EpochBatches, Split
from flsuite.federation.method import Method
from flsuite.federation.server_context import ServerContext
from flsuite.federation.task import ClientResult, State, Weights
from flsuite.federation.weights import clone_weights
from flsuite.models.representation import check_contract

Ensemble = Literal["logits", "mixture", "per_client"]
Noise = Literal["normal", "uniform"]


def gaussian_kl(mu: torch.Tensor, sigma: torch.Tensor, mu_g: torch.Tensor, sigma_g: torch.Tensor) -> torch.Tensor:
    """KL(N(μ, diag σ²) ‖ N(μ_g, diag σ_g²)) per row, summed over the last dimension (FedCiR Eq. (17)):
    Σ_j log(σ_g,j/σ_j) + (σ_j² + (μ_j − μ_g,j)²)/(2σ_g,j²) − 1/2."""
    return (torch.log(sigma_g / sigma) + (sigma.pow(2) + (mu - mu_g).pow(2)) / (2 * sigma_g.pow(2)) - 0.5).sum(-1)


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
            torch.manual_seed(seed)
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


class GeneratorFit(L.LightningModule):
    """E_g Adam steps of the generator on the ensemble of the round's client heads (one `training_step` over the
    pre-drawn (ε, y) batches, manual optimisation like the clients' lean loop)."""

    def __init__(
        self,
        generator: ConditionalGenerator,
        heads: Sequence[tuple[torch.Tensor, torch.Tensor]],
        coef: torch.Tensor,
        mode: Ensemble,
        diversity: float,
        lr: float,
        optimizer_state: dict | None,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator, self.mode, self.diversity, self.lr, self.weight_decay = (
            generator,
            mode,
            diversity,
            lr,
            weight_decay,
        )
        self._heads, self._coef, self._opt_state = list(heads), coef, optimizer_state
        self.losses: list[float] = []

    def configure_optimizers(self) -> torch.optim.Optimizer:
        opt = torch.optim.Adam(self.generator.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        if self._opt_state:
            opt.load_state_dict(self._opt_state)  # the moments; the round's rate and decay are set again below
            for group in opt.param_groups:
                group.update(lr=self.lr, weight_decay=self.weight_decay)
        self.optimizer = opt
        return opt

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch

    def on_fit_start(self) -> None:
        self._heads = [(w.to(self.device), b.to(self.device)) for w, b in self._heads]
        self._coef = self._coef.to(self.device)

    def training_step(self, epoch_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], batch_idx: int) -> None:
        opt = self.trainer.optimizers[
            0
        ]  # the torch optimiser of `configure_optimizers` (Lightning's wrapper holds the same)
        for eps, y in epoch_batches:
            eps, y = eps.to(self.device), y.to(self.device)
            opt.zero_grad(set_to_none=True)
            z = self.generator(y, eps)
            loss = ensemble_loss(z, y, self._heads, self._coef, self.mode)
            if self.diversity:
                loss = loss + self.diversity * diversity_loss(eps, z)
            loss.backward()
            opt.step()
            self.losses.append(float(loss.detach()))


def _cpu(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: _cpu(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_cpu(v) for v in tree)
    return tree


class GeneratorMethod(Method):
    """Server side shared by FedCiR and FedGen (a mixin before `FedAvg`, e.g. `FedGen(GeneratorMethod, FedAvg)`, so
    that `super()` here is FedAvg's): the head's state-dict keys from the model contract, the generator's training
    after FedAvg aggregation (`server_update`), its checkpointed state.

    Subclasses set `noise_dim`, `hidden`, `generator_steps`, `generator_batch`, `generator_lr`, `ensemble`, `diversity`,
    `noise` (and optionally `generator_weight_decay`, Adam's L2 term, and `generator_lr_decay` γ_g: round t trains at
    generator_lr · γ_g^(t−1), the official FedGen's ExponentialLR stepped once per round) and implement `active()`
    (False: no generator at all, exactly FedAvg) and `ensemble_coefficients(results) -> [K, C]`."""

    noise_dim: int
    hidden: int
    generator_steps: int
    generator_batch: int
    generator_lr: float
    ensemble: Ensemble
    noise: Noise = "normal"
    diversity: float = 0.0
    generator_weight_decay: float = 0.0
    generator_lr_decay: float = 1.0

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        head = check_contract(model).head
        names = {id(p): n for n, p in model.named_parameters()}
        if head.bias is None:
            raise TypeError(f"{type(self).__name__} needs a head with a bias (the ensemble h_k(z) = W_k z + b_k)")
        self._head_keys = (names[id(head.weight)], names[id(head.bias)])
        self.num_classes, self.dim = head.out_features, head.in_features

    def active(self) -> bool:
        raise NotImplementedError

    def ensemble_coefficients(self, results: Sequence[ClientResult]) -> torch.Tensor:
        raise NotImplementedError

    def generator_labels(self, results: Sequence[ClientResult]) -> torch.Tensor:
        """Classes the server draws labels from (uniformly): all of them (FedCiR spec §7.10)."""
        return torch.arange(self.num_classes)

    def train_generator(self, ctx: ServerContext, state: State) -> tuple[State, float]:
        """E_g steps on the round's uploaded heads; a fresh generator (from the server stream) in the first round.
        Returns the new generator state and the mean loss of its steps."""
        gen = build_generator(
            self.num_classes,
            self.dim,
            self.noise_dim,
            self.hidden,
            seed=None if "generator" in state else ctx.seed_for("generator/init"),
        )
        if "generator" in state:
            gen.load_state_dict(state["generator"])
        wk, bk = self._head_keys
        heads = [(r.weights[wk].float(), r.weights[bk].float()) for r in ctx.results]
        n = self.generator_steps * self.generator_batch
        rng = ctx.generator("generator/batches")
        labels = self.generator_labels(ctx.results)
        y = labels[torch.randint(len(labels), (n,), generator=rng)]
        eps = draw_noise(n, self.noise_dim, self.noise, generator=rng)
        lr = self.generator_lr * self.generator_lr_decay ** (ctx.round - 1)
        coef = self.ensemble_coefficients(ctx.results)
        fit = GeneratorFit(
            gen.train(),
            heads,
            coef,
            self.ensemble,
            self.diversity,
            lr,
            state.get("optimizer"),
            self.generator_weight_decay,
        )
        batches = EpochBatches(Split(eps, y), self.generator_batch, ctx.generator("generator/order"), epochs=1)
        ctx.fit(fit, batches, purpose="generator")
        opt_state = _cpu(fit.optimizer.state_dict())
        new = {"generator": clone_weights({k: v.cpu() for k, v in gen.state_dict().items()}), "optimizer": opt_state}
        return new, sum(fit.losses) / max(len(fit.losses), 1)


@torch.no_grad()
def class_gaussian_mle(
    sample: Any, num_classes: int, num_samples: int, noise_dim: int, noise: Noise, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class MLE of a diagonal Gaussian from `num_samples` draws z = sample(y, ε) per class (FedCiR spec §1.4):
    μ_g(y) = mean_n z_n, σ_g(y) = sqrt(mean_n (z_n − μ_g(y))²) (biased), computed in float64, returned in float32."""
    mus, sigmas = [], []
    for c in range(num_classes):
        eps = draw_noise(num_samples, noise_dim, noise, generator=generator)
        z = sample(torch.full((num_samples,), c, dtype=torch.long), eps).double()
        mu = z.mean(0)
        mus.append(mu)
        sigmas.append((z - mu).pow(2).mean(0).sqrt())
    return torch.stack(mus).float(), torch.stack(sigmas).float()
