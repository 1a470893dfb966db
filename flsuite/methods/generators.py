"""What FedCiR and FedGen share on the server: the generator's training over the round's client heads
(`GeneratorMethod`; the generator and its loss: `flsuite.methods.generator_model`), and the closed-form Gaussian KL
that FedCiR's L_align and FedSR's conditional-MI term use.

Training is E_g Adam steps per round as a server-side Lightning fit (`ServerContext.fit` of
`flsuite.methods.generator_fit.GeneratorFit`); the generator and its Adam moments are kept across rounds in the server
state. Its noise and labels come from the derived server stream.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from flsuite.data.base import EpochBatches, Split
from flsuite.federation.method import Method
from flsuite.federation.server_context import ServerContext
from flsuite.federation.task import ClientResult, State
from flsuite.federation.weights import clone_weights
from flsuite.methods.generator_model import Ensemble, Noise, build_generator, draw_noise
from flsuite.models.representation import check_contract

#: Names this module held before the generator, its loss and its Lightning fit moved to modules of their own; an old
#: import still finds them, with a DeprecationWarning.
_MOVED_NAMES = {
    **dict.fromkeys(
        ("ConditionalGenerator", "frozen_generator", "ensemble_loss", "diversity_loss"),
        "flsuite.methods.generator_model",
    ),
    "GeneratorFit": "flsuite.methods.generator_fit",
}


def __getattr__(name: str) -> Any:
    home = _MOVED_NAMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"{__name__}.{name} is now {home}.{name}; import it from there", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(home), name)


def gaussian_kl(mu: torch.Tensor, sigma: torch.Tensor, mu_g: torch.Tensor, sigma_g: torch.Tensor) -> torch.Tensor:
    """KL(N(μ, diag σ²) ‖ N(μ_g, diag σ_g²)) per row, summed over the last dimension (FedCiR Eq. (17)):
    Σ_j log(σ_g,j/σ_j) + (σ_j² + (μ_j − μ_g,j)²)/(2σ_g,j²) − 1/2."""
    return (torch.log(sigma_g / sigma) + (sigma.pow(2) + (mu - mu_g).pow(2)) / (2 * sigma_g.pow(2)) - 0.5).sum(-1)


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
        from flsuite.methods.generator_fit import GeneratorFit  # Lightning: imported by the runs that train one

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
