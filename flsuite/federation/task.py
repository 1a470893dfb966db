"""The engine's messages: what travels between the server and a client in one round, and what a server-side
computation returns.

A `ClientTask` goes out (global weights, the method's broadcast extras, that client's persisted state); a
`ClientResult` comes back (new weights, uploaded extras, the client's new state), or a `ClientFailure` when every
attempt failed. Client state is plain data, so executors stay stateless and a checkpoint captures the whole
federation. `LocalTraining` says how every client trains; `ServerUpdate` is what the server's hooks return.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from flsuite.data.augment import Augment

#: A model's parameters and buffers, by state-dict name.
Weights = dict[str, torch.Tensor]
#: Data a method keeps between rounds: tensors, numbers, strings, and lists/dicts of them (checkpoint-safe).
State = dict[str, Any]


#: The local loops (`LocalTraining.loop`).
Loop = Literal["auto", "lean", "standard", "compiled"]


@dataclass
class LocalTraining:
    """How every client trains in one round.

    Args:
        epochs: Local epochs over the client's training set per round (the papers' "local updating rounds" U).
        steps: If set, exactly this many optimiser steps per round instead of `epochs` (the data is reshuffled and
            cycled as often as needed).
        batch_size: Local mini-batch size.
        optimizer: Local optimiser: "sgd", "adam" or "adamw".
        lr: Local learning rate (of round 1; see `lr_milestones`).
        lr_milestones: Rounds from which the local learning rate is multiplied by `lr_gamma` once more (a piecewise-
            constant schedule over rounds, e.g. FedEGG's η_t); empty: constant.
        lr_gamma: The factor applied at each milestone.
        lr_decay: A per-round exponential factor d: round t trains at lr · d^(t−1) (times the milestones' factors),
            e.g. FedGen's official client rate (0.99); 1: off.
        momentum: SGD momentum (ignored by Adam/AdamW).
        weight_decay: L2 weight decay.
        drop_last: Drop the last incomplete batch of each epoch.
        accelerator: Lightning accelerator used inside client fits ("cpu", "gpu", "auto").
        loop: "auto" (default): decided once per run (flsuite.federation.local.choice, logged and recorded in
            environment.json): "compiled" for a head on feature vectors with plain SGD, no step hooks and enough local
            steps to pay the compilation, "standard" with mixed precision, else "lean". "lean": one `training_step` per
            epoch over pre-sliced in-memory batches with manual optimisation, for tiny frozen-feature heads, bit for bit
            the loop of earlier releases; "standard": Lightning's per-batch automatic optimisation through a DataLoader
            (same batch order), for end-to-end image models and mixed precision; "compiled": the lean loop with its
            steps compiled (flsuite.federation.local.compiled): with plain SGD and a method without step hooks, each
            epoch's run of full batches is one compiled call (gradients and updates of all its steps), else one compiled
            forward-and-backward per batch; after a one-off compilation per process, the same training up to the last
            bits (not a bit-identical rerun of a lean run), for methods whose local loss dynamo captures whole. Speed
            and accuracy against the lean loop: docs/performance.md.
        precision: Lightning precision of client fits ("32-true", or "16-mixed"/"bf16-mixed" with loop "standard").
        augment: Per-batch training augmentation of image inputs (random crop with padding, horizontal flip), drawn
            from the task's seeded "augment" stream; off by default.
    """

    epochs: int = 1
    steps: int | None = None
    batch_size: int = 16
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = 0.01
    lr_milestones: list[int] = field(default_factory=list)
    lr_gamma: float = 0.1
    lr_decay: float = 1.0
    momentum: float = 0.9
    weight_decay: float = 1e-5
    drop_last: bool = False
    accelerator: str = "cpu"
    loop: Loop = "auto"
    precision: Literal["32-true", "16-mixed", "bf16-mixed"] = "32-true"
    augment: Augment = field(default_factory=Augment)

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"local.epochs must be >= 1, got {self.epochs}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"local.steps must be >= 1 or null, got {self.steps}")
        if self.batch_size < 1:
            raise ValueError(f"local.batch_size must be >= 1, got {self.batch_size}")
        if self.lr <= 0:
            raise ValueError(f"local.lr must be > 0, got {self.lr}")
        if any(m < 1 for m in self.lr_milestones) or list(self.lr_milestones) != sorted(set(self.lr_milestones)):
            raise ValueError(f"local.lr_milestones must be increasing rounds >= 1, got {self.lr_milestones}")
        if self.lr_gamma <= 0:
            raise ValueError(f"local.lr_gamma must be > 0, got {self.lr_gamma}")
        if not 0 < self.lr_decay <= 1:
            raise ValueError(f"local.lr_decay must be in (0, 1], got {self.lr_decay}")
        if self.loop not in ("auto", "lean", "standard", "compiled"):
            raise ValueError(f"local.loop must be 'auto', 'lean', 'standard' or 'compiled', got {self.loop!r}")
        if self.precision not in ("32-true", "16-mixed", "bf16-mixed"):
            raise ValueError(f"local.precision must be '32-true', '16-mixed' or 'bf16-mixed', got {self.precision!r}")
        if self.precision != "32-true" and self.loop not in ("standard", "auto"):
            raise ValueError(
                f"local.precision {self.precision!r} needs local.loop: standard "
                "(the lean and compiled loops step the raw optimiser in 32-bit)"
            )

    @property
    def sgd_momentum(self) -> float:
        """The momentum μ of the local steps: `momentum` with SGD, 0 with Adam/AdamW (which ignore it)."""
        return self.momentum if self.optimizer == "sgd" else 0.0

    def lr_at(self, round: int) -> float:
        """The local learning rate in `round`: lr · d^(round − 1) · γ^(number of milestones ≤ round)."""
        passed = sum(1 for m in self.lr_milestones if m <= round)
        lr = self.lr * self.lr_decay ** (round - 1) if self.lr_decay != 1 else self.lr
        return lr * self.lr_gamma**passed if passed else lr

    def make_optimizer(self, params, round: int = 1) -> torch.optim.Optimizer:
        """The local optimiser over `params` for `round` (its learning rate follows the schedule)."""
        lr = self.lr_at(round)
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=self.momentum, weight_decay=self.weight_decay)
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=lr, weight_decay=self.weight_decay)
        return torch.optim.AdamW(params, lr=lr, weight_decay=self.weight_decay)


@dataclass
class ClientTask:
    """One client's work order for one round. `global_weights` are the global weights that travel down
    (`Method.weights_down`); `held`, the rest that the client already holds (not sent, not counted); entries the
    method keeps on the client are in neither (`flsuite.federation.method.Transport.downward`)."""

    round: int
    client_id: int
    seed: int
    global_weights: Weights
    broadcast: dict[str, Any] = field(default_factory=dict)
    state: State = field(default_factory=dict)
    held: Weights = field(default_factory=dict)


@dataclass
class ClientResult:
    """What a client sends back after its local fit (plus its new persisted state, which stays client-side). Built by
    the engine (`flsuite.federation.local.client.run_client`): `weights` holds only what the method declares
    travelling up (`flsuite.federation.method.Transport.upward`)."""

    client_id: int
    num_samples: int
    weights: Weights
    upload: dict[str, Any] = field(default_factory=dict)
    state: State = field(default_factory=dict)
    train_loss: float = float("nan")
    num_steps: int = 0
    #: The mean loss of the FL task itself (cross-entropy on the client's data) over the fit's steps, without the
    #: terms the method adds to its objective (`ClientModule.TASK_LOSS`); `train_loss` where the method adds none.
    task_loss: float = float("nan")
    #: Numbers the method reports about this fit (`ClientModule.metrics`); logged as `client/<method>/<key>`.
    metrics: dict[str, float] = field(default_factory=dict)
    #: Whether every floating-point entry of the client's trained model is finite (all of it, not only the weights
    #: that travel): a result with NaN/Inf is rejected.
    finite: bool = True


@dataclass
class ClientFailure:
    """A client task that failed on every attempt."""

    client_id: int
    round: int
    error: str
    attempts: int


@dataclass
class ServerUpdate:
    """What a server-side computation returns: new weights, its new state, metrics to log (`server/<name>/...`)."""

    weights: Weights
    state: State
    metrics: dict[str, float] = field(default_factory=dict)
