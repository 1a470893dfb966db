"""FedEGG (Zhai et al., "Federated Learning with Explicit Global Guidance"): a gated server-side guiding task.

FedEGG is a `ServerStep`, so "X + FedEGG" is any method X followed by this step (`server_steps:`), X's own state
untouched (spec A11). FedAvg + FedEGG uses `FedAvg(weighting: uniform)`, the paper's Eq. 5.

Phase 1, once, when the phase starts (`init_state`, under the initial weights W₀; checkpointed, never re-asked):
    F = mean_{x∈D^g} f^l(W₀; x)                          the server's guiding-set mean feature (broadcast)
    τ_k = log₂ cos(mean_{x∈D_k} f^l(W₀; x), F)           (Eq. 2; a client query, its bytes counted)
    τ = ρ · (1/N) Σ_k τ_k + ι                            (Eq. 3; ρ = 2, ι = −0.5)
    or the Remark-3.8 form τ = log₂(ρ · cos(mean_k mean-feature_k, F) + ι), or a fixed τ.
    L^g ← L(W₀, D^g) with the fresh guiding head (A4).
Every round, after X's aggregation W̄_t (Alg. 1 phase 2):
    L^c ← β L^c + (1 − β) (1/m) Σ_{k∈S} L_k              (Eq. 6; L^c starts at the first round's mean, A4;
                                                          L_k the client's FL-task cross-entropy, `task_loss`,
                                                          whatever terms X adds to its objective)
    if log₂(L^c / L^g) < τ:                              (Eq. 8, re-checked every round; `latch` stops for good, A12)
        T_g times: W̄_t ← W̄_t − γ_t ∇F(W̄_t, ξ^g)         (Eq. 7; ξ^g a mini-batch of D^g, γ_t = η_t, A8)
        L^g ← L(W̄_t, D^g)                                 (refreshed only when guiding ran)
    W_t ← W̄_t
    update_ratio = ‖W_t − W̄_t‖ / ‖W̄_t − W_{t−1}‖          (over the model's parameters; 0 in unguided rounds)

Decisions (spec rows): the guiding task trains the shared trunk `features` and its own Linear head, held in this
step's state, server-only, never averaged; the FL head is untouched by Eq. 7 (A1). With `shared_head` the guiding
labels are mapped onto FL labels through the selection table (a `GuidingSet` records, per guiding class, the FL class
it was chosen for) and Eq. 7 trains the whole model, FL head included; a guiding class chosen for no FL class (MH's
and HH's unrelated classes) is refused by name. BatchNorm statistics update during guiding (train mode, A17) unless
`freeze_bn`, which keeps every BatchNorm layer in eval mode there (running statistics used and kept; their affine
weights still train). f^l = `model.features(x)`, the
last hidden layer (post-ReLU for the suite's MLP/CNN heads), cos clamped to ≥ 1e-8 before log₂ (A2); log₂ everywhere
(A5). L_k = the client's mean mini-batch loss of the round (A9); L^g on D^g or a fixed seeded subset of `eval_size`.
Guiding steps are plain SGD (no momentum or weight decay, Eq. 7) at γ_t = `lr_scale` · `local.lr_at(t)`;
`lr_scale: 0` (γ = 0) skips the steps, so the run is FedAvg's (Remark 3.9), as it is with `tau: -inf`.
The paper's features come from the pre-trained W₀; here W₀ is the run's initial model (on frozen-encoder
features, the encoder is the pre-trained part). The equations as functions, and Eq. 2's client query (`TauQuery`):
`flsuite.methods.fedegg_equations`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from flsuite.data.base import EpochBatches, Split
from flsuite.data.guiding import fl_labels
from flsuite.federation.server import PublicData, ServerStep, StepRun
from flsuite.federation.server_context import ServerContext
from flsuite.federation.task import LocalTraining, ServerUpdate, State, Weights
from flsuite.federation.weights import clone_weights
from flsuite.methods.fedegg_equations import (
    CHUNK,
    TauQuery,
    gate_open,
    llr,
    log2_cos,
    mean_feature,
    momentum_loss,
    threshold,
    update_ratio,
)
from flsuite.models.representation import check_contract
from flsuite.seeding import numpy_rng, torch_generator


class Guided(nn.Module):
    """What the guiding step trains: the shared trunk with the guiding head, head_g(features(x)) (the FL head not in
    the graph), or with `head` None the whole model (shared_head). With `freeze_bn`, `train()` leaves the model's
    BatchNorm layers in eval mode."""

    def __init__(self, model: nn.Module, head: nn.Linear | None, freeze_bn: bool = False) -> None:
        super().__init__()
        self.model, self.head, self.freeze_bn = model, head, freeze_bn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) if self.head is None else self.head(check_contract(self.model).features(x))

    def train(self, mode: bool = True) -> Guided:
        super().train(mode)
        if self.freeze_bn:
            for module in self.model.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self


class FedEGG(ServerStep):
    """FedEGG's gated guiding step (see the module docstring).

    Args:
        data: The guiding set D^g (a server-side data config, e.g. `flsuite.data.guiding.GuidingSet`).
        tau: A fixed threshold τ (e.g. for a sweep; `-.inf` never guides); null: computed in Phase 1 (`tau_form`).
        tau_form: "eq3" (Eq. 3, the algorithm box; A3) or "remark" (Remark 3.8's log₂(ρ·cos + ι), needs ρ·cos + ι > 0).
        rho: ρ of Eq. 3.
        iota: ι of Eq. 3.
        beta: Loss momentum β of Eq. 6 (paper silent; 0.9, A4).
        steps: Guiding steps T_g per round.
        batch_size: Guiding mini-batch size.
        lr_scale: γ_t = lr_scale · η_t (1: the paper's γ = η; 0 disables guiding, Remark 3.9).
        shared_head: Train the FL head on the guiding labels mapped to FL labels (spec A1), instead of a guiding head.
        freeze_bn: BatchNorm layers in eval mode during the guiding steps (A17; default: train mode, stats update).
        latch: Stop guiding for good the first time the gate closes (A12); default: re-check every round (Alg. 1).
        eval_size: L^g on at most this many guiding samples (a fixed seeded subset; null: all of D^g, A9).
        num_classes: Guiding classes (the guiding head's outputs); null: max label + 1.
    """

    def __init__(
        self,
        data: PublicData,
        tau: float | None = None,
        tau_form: Literal["eq3", "remark"] = "eq3",
        rho: float = 2.0,
        iota: float = -0.5,
        beta: float = 0.9,
        steps: int = 1,
        batch_size: int = 64,
        lr_scale: float = 1.0,
        latch: bool = False,
        eval_size: int | None = 2000,
        num_classes: int | None = None,
        shared_head: bool = False,
        freeze_bn: bool = False,
    ) -> None:
        if tau_form not in ("eq3", "remark"):
            raise ValueError(f"FedEGG tau_form must be 'eq3' or 'remark', got {tau_form!r}")
        if (
            not 0 <= beta < 1
            or steps < 1
            or batch_size < 1
            or lr_scale < 0
            or (eval_size is not None and eval_size < 1)
        ):
            raise ValueError(
                "FedEGG needs 0 <= beta < 1, steps >= 1, batch_size >= 1, lr_scale >= 0 and eval_size >= 1 or null"
            )
        self.data, self.tau, self.tau_form, self.rho, self.iota, self.beta = data, tau, tau_form, rho, iota, beta
        self.steps, self.batch_size, self.lr_scale, self.latch = steps, batch_size, lr_scale, latch
        self.eval_size, self.num_classes, self.shared_head, self.freeze_bn = (
            eval_size,
            num_classes,
            shared_head,
            freeze_bn,
        )
        self._split: Split | None = None
        self._eval: Split | None = None
        self._local: LocalTraining | None = None

    def prepare(self, run: StepRun) -> None:
        seed = run.settings.seeds.data  # the guiding set and its L^g subset are data: the data seed (flsuite.seeding)
        built = self.data.source.build(seed)
        self._split = self.data.pool(built)
        if len(self._split) == 0:
            raise ValueError("FedEGG: the guiding set (data) is empty")
        if self.shared_head:
            table = fl_labels(built, run.data.classes)
            self._split = Split(self._split.x, table[self._split.y])
        n = len(self._split)
        keep = n if self.eval_size is None else min(n, self.eval_size)
        rows = torch.from_numpy(numpy_rng(seed, purpose="fedegg/eval").choice(n, keep, replace=False)).sort().values
        self._eval = self._split if keep == n else self._split.subset(rows)
        self._local = run.settings.local

    # ---- Phase 1 ---------------------------------------------------------------------------------------------
    def init_state(self, global_weights: Weights, run: StepRun) -> State:
        assert self._split is not None and self._eval is not None
        fed = run.settings
        model = fed.model.build(run.data.input_shape, run.data.num_classes)
        model.load_state_dict(global_weights)
        guide_mean = mean_feature(model, self._split.x)
        head = None if self.shared_head else self._new_head(guide_mean.numel(), fed.seed)
        state: State = {
            "head": None if head is None else clone_weights(head.state_dict()),
            "loss_c": None,
            "rounds_guided": 0,
            "stopped": False,
        }
        if self.tau is not None:
            state["tau"] = float(self.tau)
        elif self.tau_form == "eq3":
            uploads = run.query(
                TauQuery("eq3"), broadcast={"guide_mean": guide_mean.to(torch.float32)}, weights=global_weights
            ).uploads()
            state["tau_k"] = [float(uploads[k]["tau_k"]) for k in sorted(uploads)]
            state["tau"] = threshold(state["tau_k"], self.rho, self.iota)
        else:
            uploads = run.query(TauQuery("remark"), weights=global_weights).uploads()
            client_mean = torch.stack([uploads[k]["mean_feature"].to(torch.float64) for k in sorted(uploads)]).mean(0)
            inner = self.rho * 2 ** log2_cos(client_mean, guide_mean) + self.iota
            if inner <= 0:
                raise ValueError(
                    f"FedEGG tau_form 'remark': rho * cos + iota = {inner:.4g} <= 0, its log is undefined; "
                    "use tau_form 'eq3' or a fixed tau"
                )
            state["tau"] = math.log2(inner)
        state["loss_g"] = self._guiding_loss(model, head)
        return state

    def _new_head(self, width: int, seed: int) -> nn.Linear:
        """The guiding head: nn.Linear's default uniform(±1/√width) initialisation, drawn from its own seeded stream."""
        assert self._split is not None, "FedEGG.prepare builds the guiding set before init_state"
        classes = self.num_classes or int(self._split.y.max()) + 1
        head = torch.nn.utils.skip_init(nn.Linear, width, classes)
        gen, bound = torch_generator(seed, purpose="server/fedegg/head"), 1.0 / math.sqrt(width)
        with torch.no_grad():
            for p in head.parameters():
                p.copy_(torch.rand(p.shape, generator=gen) * 2 * bound - bound)
        return head

    def _guiding_loss(self, model: nn.Module, head: nn.Linear | None) -> float:
        """L^g = mean cross-entropy of the guiding task (its head, or the FL head on mapped labels) on the
        evaluation rows of D^g."""
        assert self._eval is not None
        guided = Guided(model, head).eval()
        with torch.no_grad():
            total = sum(
                F.cross_entropy(guided(x), y, reduction="sum").double()
                for x, y in zip(self._eval.x.split(CHUNK), self._eval.y.split(CHUNK))
            )
        return float(total) / len(self._eval)

    # ---- Phase 2 ---------------------------------------------------------------------------------------------
    def step(self, ctx: ServerContext, weights: Weights, state: State) -> ServerUpdate:
        assert self._split is not None and self._local is not None, "FedEGG.prepare was not called"
        loss_c = momentum_loss(
            state["loss_c"], [r.task_loss for r in ctx.results], self.beta
        )  # the FL task's CE, not X's objective
        loss_g, tau = float(state["loss_g"]), float(state["tau"])
        ratio = llr(loss_c, loss_g)
        guide = gate_open(loss_c, loss_g, tau) and not state["stopped"]
        gamma = self.lr_scale * self._local.lr_at(ctx.round)
        new = {**state, "loss_c": loss_c, "stopped": bool(state["stopped"] or (self.latch and not guide))}
        aggregated, ratio_of_update = weights, 0.0
        if guide:
            model = ctx.model(weights)
            head = None
            if state["head"] is not None:
                head = torch.nn.utils.skip_init(
                    nn.Linear, *reversed(state["head"]["weight"].shape)
                )  # no global-RNG draw
                head.load_state_dict(state["head"])
            if gamma > 0:
                self._fit(ctx, Guided(model, head, self.freeze_bn), gamma)
                weights = clone_weights(model.state_dict())
                new["head"] = None if head is None else clone_weights(head.state_dict())
                ratio_of_update = update_ratio(ctx.start_weights, aggregated, weights, model)
            new["loss_g"] = self._guiding_loss(model, head)
            new["rounds_guided"] = int(state["rounds_guided"]) + 1
        metrics = {
            "tau": tau,
            "loss_c": loss_c,
            "loss_g": float(new["loss_g"]),
            "llr": ratio,
            "gate": int(guide),
            "lr": gamma,
        }
        return ServerUpdate(weights, new, {**metrics, "update_ratio": ratio_of_update})

    def _fit(self, ctx: ServerContext, guided: Guided, gamma: float) -> None:
        """T_g plain-SGD steps of Eq. 7 at γ_t, as a seeded server-side Lightning fit."""
        local = LocalTraining(
            steps=self.steps,
            batch_size=self.batch_size,
            lr=gamma,
            momentum=0.0,
            weight_decay=0.0,
            accelerator=ctx.accelerator,
        )
        assert self._split is not None, "FedEGG.prepare builds the guiding set before the first step"
        batches = EpochBatches(self._split, self.batch_size, ctx.generator(f"{self.name}/batches"), steps=self.steps)
        ctx.train(guided.train(), batches, local, purpose=self.name)  # a fit keeps the modules' modes: set them here
        guided.cpu()
