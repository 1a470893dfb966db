"""FedGen (Zhu, Hong & Zhou, ICML 2021, "Data-Free Knowledge Distillation for Heterogeneous Federated Learning").

Server (after FedAvg): E_g Adam steps of a conditional generator G(y, ε), ε ~ U[0, 1)^{noise_dim} (the official code's
noise), on the round's uploaded heads h_k with per-label weights w_k(y) = n_{k,y} / Σ_k' n_{k',y}:
    L_G = (1/B) Σ_i Σ_k w_k(y_i) CE(h_k(G(y_i, ε_i)), y_i) + η · L_div,        y_i uniform over the classes seen,
L_div FedGen's diversity loss (`flsuite.methods.generator_model`). G is broadcast; each client also uploads its label
counts n_{k,y}: `count_start` (1, the official `clean_up_counts`) plus the labels of its local batches of the round;
the server draws y_i from the classes some client counted beyond that start (the official MIN_SAMPLES_PER_LABEL).
G's Adam has weight decay 1e-2 and its rate decays by 0.98 a round (the official generative_optimizer/_lr_scheduler).
Client k in round t (1-based), with α_t = max(1e-4, α·γ^{t−1}) and β_t likewise (the official exponential decay):
    L = CE(f(x), y) + α_t · CE(h(G(ỹ, ε̃)), ỹ) + β_t · KL(softmax(h(G(y, ε))) ‖ softmax(f(x))),
    ỹ_i uniform over all classes, the KL's target detached, G frozen (eval mode, no gradient).
Round 1 has no generator yet (the official code regularises from its second round too). α = β = 0: no generator is
trained or sent and no counts are uploaded, so the run is FedAvg exactly.
Deviations: E_g = 5 and the generator shared with FedCiR (FedCiR's comparison; the official code takes
ensemble_epochs = 50 steps); the per-label weights multiply each sample's CE (the official code's broadcasting
averages them instead: mean_i CE_i · mean_j w_j). The client optimiser is the run's `local` (the official one is plain
SGD with its rate decayed by 0.99 a round: configs/fedcir/fedgen_official_optimizer.yaml).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule
from flsuite.federation.server_context import ServerContext
from flsuite.federation.task import ClientResult, ServerUpdate, State, Weights
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.generator_model import Noise, draw_noise, frozen_generator
from flsuite.methods.generators import GeneratorMethod
from flsuite.models.representation import check_contract


def decayed(value: float, decay: float, round: int) -> float:
    """max(1e-4, value · decay^(round − 1)), or 0 for a term that is off."""
    return max(1e-4, value * decay ** (round - 1)) if value > 0 else 0.0


@dataclass(frozen=True)
class FedGenClientSettings:
    """What FedGen's clients read (see `FedGen`; `active`: a term is on, so label counts are uploaded)."""

    alpha: float
    beta: float
    decay: float
    noise_dim: int
    hidden: int
    noise: Noise
    count_start: int
    active: bool


class FedGenClient(ClientModule[FedGenClientSettings]):
    """CE + α_t · CE of the local head on generator samples + β_t · KL(generator-sample prediction ‖ prediction)."""

    def begin(self) -> None:
        b, m = self.task.broadcast, self.method
        head = check_contract(self.model).head
        self._frozen = (
            {
                "gen": frozen_generator(
                    b["generator"], head.out_features, head.in_features, m.noise_dim, m.hidden, self.device
                )
            }
            if "generator" in b
            else {}
        )
        self._counts = torch.full((head.out_features,), self.method.count_start, dtype=torch.long, device=self.device)
        # α_t, β_t as tensors: one compiled graph serves every round (as floats, each round was a new graph, and a run
        # failed at dynamo's recompile limit).
        r = self.task.round
        self._alpha_t, self._beta_t = (
            torch.tensor(decayed(weight, m.decay, r), device=self.device) for weight in (m.alpha, m.beta)
        )

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        m = self.method
        logits = self.model(x)
        ce = loss = F.cross_entropy(logits, y)
        if self._frozen:
            gen, head = self._frozen["gen"], check_contract(self.model).head
            with torch.no_grad():
                z_y = gen(y, draw_noise(len(y), m.noise_dim, m.noise, device=y.device))
                y_gen = torch.randint(head.out_features, (len(y),), device=y.device)
                z_gen = gen(y_gen, draw_noise(len(y), m.noise_dim, m.noise, device=y.device))
                target = F.softmax(head(z_y), dim=1)
            latent = F.kl_div(F.log_softmax(logits, dim=1), target, reduction="batchmean")
            loss = loss + self._alpha_t * F.cross_entropy(head(z_gen), y_gen) + self._beta_t * latent
        return loss, {self.TASK_LOSS: ce, "y": y} if m.active else {self.TASK_LOSS: ce}

    def gather(self, statistics: dict[str, torch.Tensor]) -> None:
        """The label counts the server's generator is trained on."""
        self._counts += torch.bincount(statistics["y"], minlength=len(self._counts))

    def upload(self, fit: FitStatistics) -> dict:
        return {"label_counts": self._counts.cpu()} if self.method.active else {}


class FedGen(GeneratorMethod, FedAvg):
    """FedGen: a server-trained feature generator regularises the local classifiers; FedAvg aggregation.

    Args:
        alpha: Initial weight α of the generator-sample CE (10, the official MNIST and CelebA "generative_alpha").
        beta: Initial weight β of the latent KL (10, likewise; the official EMNIST setting has 1).
        decay: Per-round decay γ of α and β (0.98).
        generator_steps: E_g, generator steps per round (5, as in FedCiR's comparison).
        generator_batch: Generator batch size (32).
        noise_dim: Generator noise dimension (32).
        hidden: Generator hidden width (256).
        generator_lr: Adam learning rate of the generator in round 1 (3e-4, the official "ensemble_lr").
        generator_lr_decay: Its per-round decay γ_g (0.98, the official ExponentialLR).
        generator_weight_decay: Adam's weight decay on the generator (1e-2, the official "weight_decay").
        diversity: Weight η of the diversity loss (1, the official "ensemble_eta").
        count_start: Every label's count before a client's batches are counted (1, the official label_counts).
        weighting: FedAvg's weights: "samples" or "uniform".
    """

    client_module = FedGenClient

    def client_settings(self) -> FedGenClientSettings:
        return FedGenClientSettings(
            self.alpha, self.beta, self.decay, self.noise_dim, self.hidden, self.noise, self.count_start, self.active()
        )

    def __init__(
        self,
        alpha: float = 10.0,
        beta: float = 10.0,
        decay: float = 0.98,
        generator_steps: int = 5,
        generator_batch: int = 32,
        noise_dim: int = 32,
        hidden: int = 256,
        generator_lr: float = 3e-4,
        generator_lr_decay: float = 0.98,
        generator_weight_decay: float = 1e-2,
        diversity: float = 1.0,
        count_start: int = 1,
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        super().__init__(weighting=weighting)
        if alpha < 0 or beta < 0 or not 0 < decay <= 1 or diversity < 0:
            raise ValueError(
                "FedGen needs alpha, beta, diversity >= 0 and 0 < decay <= 1, "
                f"got {alpha}, {beta}, {diversity}, {decay}"
            )
        if min(generator_steps, generator_batch, noise_dim, hidden) < 1 or generator_lr <= 0:
            raise ValueError(
                "FedGen: generator_steps, generator_batch, noise_dim, hidden must be >= 1 and generator_lr > 0"
            )
        if not 0 < generator_lr_decay <= 1 or generator_weight_decay < 0 or count_start < 0:
            raise ValueError(
                "FedGen needs 0 < generator_lr_decay <= 1, generator_weight_decay >= 0 and count_start >= 0, "
                f"got {generator_lr_decay}, {generator_weight_decay} and {count_start}"
            )
        self.generator_lr_decay, self.generator_weight_decay, self.count_start = (
            generator_lr_decay,
            generator_weight_decay,
            count_start,
        )
        self.alpha, self.beta, self.decay, self.diversity = alpha, beta, decay, diversity
        self.generator_steps, self.generator_batch, self.noise_dim, self.hidden = (
            generator_steps,
            generator_batch,
            noise_dim,
            hidden,
        )
        self.generator_lr, self.ensemble, self.noise = generator_lr, "per_client", "uniform"

    def active(self) -> bool:
        return self.alpha > 0 or self.beta > 0

    def _counts(self, results: Sequence[ClientResult]) -> torch.Tensor:
        return torch.stack([r.upload["label_counts"] for r in results]).double()  # [K, C]

    def ensemble_coefficients(self, results: Sequence[ClientResult]) -> torch.Tensor:
        counts = self._counts(results)
        return (counts / counts.sum(0).clamp_min(1)).float()

    def generator_labels(self, results: Sequence[ClientResult]) -> torch.Tensor:
        return torch.nonzero(self._counts(results).amax(0) > self.count_start).flatten()

    def broadcast(self, round: int, server_state: State) -> dict:
        return {"generator": server_state["generator"]} if "generator" in server_state else {}

    def server_update(self, ctx: ServerContext, weights: Weights, server_state: State) -> ServerUpdate:
        if not self.active():
            return ServerUpdate(weights, server_state)
        new, loss = self.train_generator(ctx, server_state)
        return ServerUpdate(weights, {**server_state, **new}, {"generator_loss": loss})
