"""The server side of a round: its context, its training, and server steps that compose with any method.

`RoundServer` is the engine's `ServerContext` (`flsuite.federation.server_context`: the contract the method's hooks
see), what the server may use after the clients of a round have reported: the round's results, a random stream derived
from (seed, round, purpose) — the same under every executor, because it never touches the process's global RNG state
that in-process clients advance — and `fit`, a lean Lightning `Trainer.fit` like a client's; `PublicData` is
server-held data declared in config.

A `ServerStep` runs after the method has aggregated ("X + step" by config, as setup stages compose with any method):
it receives the aggregated weights and its own state and returns new ones; nothing is mutated in place, so the loop
commits a round only when every part of it has finished.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from torch import nn

from flsuite import progress
from flsuite.data.base import DataSource, EpochBatches, FederatedData, Split
from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.local.choice import choose_loop, resolved
from flsuite.federation.local.loops import ClientFit, run_fit, runs_without_a_trainer
from flsuite.federation.method import ClientModule, NoSettings
from flsuite.federation.query import ClientQuery, QueryOutcome
from flsuite.federation.server_context import ServerContext
from flsuite.federation.task import (
    ClientResult,
    ClientTask,
    LocalTraining,
    Loop,
    ServerUpdate,
    State,
    Weights,
)
from flsuite.federation.weights import clone_weights
from flsuite.models.heads import ModelSpec
from flsuite.seeding import Seeds, derive_seed, seed_torch, torch_generator

if TYPE_CHECKING:
    import lightning as L

__all__ = ["PublicData", "RoundServer", "ServerFinetune", "ServerStep", "StepRun", "run_server_steps"]

#: The client id of the server's own supervised fits (`RoundServer.train`).
SERVER = -1

log = logging.getLogger(__name__)


@dataclass
class RoundServer:
    """What the server has in round `round`: the engine's `ServerContext` (see the module docstring)."""

    round: int
    seed: int
    results: Sequence[ClientResult]
    num_clients: int
    build_model: Callable[[], nn.Module]
    accelerator: str = "cpu"
    #: The global weights the round's clients started from (W_{t−1}); None outside a round.
    start_weights: Weights | None = None
    #: The run's `local.loop` as configured. A run set to `lean` (to reproduce earlier releases' bits) trains its
    #: server fits on `auto` lean too; otherwise they are decided per fit on the CPU (`train`).
    loop: Loop = "auto"

    def seed_for(self, purpose: str) -> int:
        return derive_seed(self.seed, self.round, purpose=f"server/{purpose}")

    def generator(self, purpose: str) -> torch.Generator:
        """A CPU generator for the server stream (seed, round, purpose)."""
        return torch_generator(self.seed, self.round, purpose=f"server/{purpose}")

    def model(self, weights: Weights) -> nn.Module:
        """A fresh model of the round's architecture holding `weights`."""
        model = self.build_model()
        model.load_state_dict(weights)
        return model

    def train(self, model: nn.Module, batches: EpochBatches, local: LocalTraining, purpose: str) -> FitStatistics:
        """Supervised training of `model` on the server: cross-entropy, `local`'s optimiser, the clients' loops over
        `batches` (lean or compiled on the CPU by `run_fit`, without a Trainer; else as `fit`), seeded from `purpose`
        as `fit`. `local.loop: auto` is lean in a run set to `lean` (`loop`) and on other accelerators than the
        CPU, else decided for this one fit as a run decides its clients' loop
        (`flsuite.federation.local.choice.choose_loop`: compiled for a head on feature vectors with plain SGD and
        enough steps to pay a compilation; logged when compiled). Streamed batches (`EpochBatches(reuse=True)`) go to
        the lean and compiled loops on the CPU as they are, to any other loop as fresh gathers. Returns the fit's
        statistics (`mean_loss`, `num_steps`)."""
        if local.loop == "auto" and (self.loop == "lean" or self.accelerator != "cpu"):  # the compiled server fit is
            local = dataclasses.replace(local, loop="lean")  # measured on the CPU only: elsewhere lean, as before it
        if local.loop == "auto":  # the server's fits are plain ClientModules: no step hooks, compiling pays
            split = batches.split
            choice = choose_loop(
                local,
                split.x.shape[1:],
                ClientModule.step_hooks,
                [len(split)],
                clients_per_round=1,
                rounds=1,
                processes=1,
            )
            (log.info if choice.loop == "compiled" else log.debug)("server fit %s: %s", purpose, choice.log_line())
            local = resolved(local, choice)
        client = ClientModule(model, NoSettings(), local, ClientTask(self.round, SERVER, self.seed_for(purpose), {}))
        without_trainer = runs_without_a_trainer(local.loop, self.accelerator)
        if batches.reuse and not without_trainer:  # streamed: for the loops that read each batch once, on the CPU
            batches = batches.fresh()
        if not without_trainer:  # `fit`'s Trainer: 32-bit on `accelerator`
            from flsuite.federation.local.trainer import LocalFit

            fit = LocalFit(client)
            self.fit(fit, batches, purpose=purpose)
            return fit.statistics
        with self._seeded_bar(batches.epochs, purpose) as bar:
            return run_fit(ClientFit(client), batches, batches.epochs, on_epoch_end=None if bar.disable else bar.update)

    def fit(self, module: L.LightningModule, batches: EpochBatches, purpose: str) -> None:
        """One lean `Trainer.fit` of `module` over `batches`, with torch's global RNG seeded from the server stream
        (dropout and other model-internal randomness), so serial and Ray runs train identically. A bar over its
        epochs shows it when the run shows progress (a callback only then: the fit itself is the same)."""
        from flsuite.federation.local.trainer import EpochTicks, make_trainer

        with self._seeded_bar(batches.epochs, purpose) as bar:
            callbacks: list[L.Callback] | None = None if bar.disable else [EpochTicks(bar)]
            make_trainer(
                LocalTraining(accelerator=self.accelerator), max_epochs=batches.epochs, callbacks=callbacks
            ).fit(module, train_dataloaders=batches)

    @contextlib.contextmanager
    def _seeded_bar(self, epochs: int, purpose: str) -> Iterator[Any]:
        """A server fit's set-up: torch's global RNG seeded from the server stream of `purpose`, and its epoch bar."""
        seed_torch(self.seed_for(purpose))
        with progress.bar(epochs, f"server {purpose}", "epoch") as bar:
            yield bar


@dataclass
class PublicData:
    """Server-held data declared in config: the training (or test) samples of a `DataSource`, pooled over its clients
    (or domains). It must live in the federation's input space (same encoder and preprocessing).

    Args:
        source: Where the data comes from.
        split: "train" pools the source's client training splits; "test" pools its test splits.
    """

    source: DataSource
    split: Literal["train", "test"] = "train"

    def build(self, seed: int) -> Split:
        return self.pool(self.source.build(seed))

    def pool(self, data: FederatedData) -> Split:
        """The samples of `split` of the source's built data, pooled."""
        parts = [c.train for c in data.clients] if self.split == "train" else list(data.test.values())
        return Split(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))


class StepRunSettings(Protocol):
    """The run's settings a server step reads (`flsuite.federation.context.RunSettings` has them)."""

    @property
    def seed(self) -> int: ...
    @property
    def seeds(self) -> Seeds: ...
    @property
    def model(self) -> ModelSpec: ...
    @property
    def local(self) -> LocalTraining: ...


class StepRun(Protocol):
    """What a server step may use of its run when its phase starts (`prepare`, `init_state`): the settings, the
    data, and one-shot client queries. The engine passes its `RunContext` (`flsuite.federation.context`)."""

    @property
    def settings(self) -> StepRunSettings: ...
    @property
    def data(self) -> FederatedData: ...
    def query(
        self,
        query: ClientQuery,
        clients: Sequence[int] | None = None,
        broadcast: dict[str, Any] | None = None,
        weights: Weights | None = None,
    ) -> QueryOutcome: ...


class ServerStep(abc.ABC):
    """A server-side computation after aggregation, composable with any method (`server_steps:` in YAML)."""

    @property
    def name(self) -> str:
        return type(self).__name__.lower()

    def prepare(self, run: StepRun) -> None:
        """Called at the start of every `Rounds` phase that uses the step (also on resume), e.g. to build server
        data from the data seed (`run.settings.seeds.data`)."""

    def init_state(self, global_weights: Weights, run: StepRun) -> State:
        """The step's state when its phase starts (checkpointed; not recomputed on resume). `run.query` may ask the
        clients a one-shot question here (e.g. under the initial weights)."""
        return {}

    @abc.abstractmethod
    def step(self, ctx: ServerContext, weights: Weights, state: State) -> ServerUpdate: ...


class ServerFinetune(ServerStep):
    """Fine-tune the aggregated model on server-held data with cross-entropy: `epochs` passes of local-style SGD,
    as a server-side Lightning fit (the client's lean training path, run on the server).

    Args:
        data: The server's data (e.g. a public labelled set).
        epochs: Passes over it per round.
        batch_size: Mini-batch size.
        lr: SGD learning rate.
        momentum: SGD momentum.
        every: Run in every `every`-th round.
    """

    def __init__(
        self,
        data: PublicData,
        epochs: int = 1,
        batch_size: int = 32,
        lr: float = 0.01,
        momentum: float = 0.0,
        every: int = 1,
    ) -> None:
        if epochs < 1 or batch_size < 1 or lr <= 0 or every < 1:
            raise ValueError("ServerFinetune needs epochs >= 1, batch_size >= 1, lr > 0 and every >= 1")
        self.data, self.epochs, self.batch_size, self.lr, self.momentum, self.every = (
            data,
            epochs,
            batch_size,
            lr,
            momentum,
            every,
        )
        self._split: Split | None = None

    def prepare(self, run: StepRun) -> None:
        self._split = self.data.build(run.settings.seeds.data)

    def step(self, ctx: ServerContext, weights: Weights, state: State) -> ServerUpdate:
        if ctx.round % self.every or self._split is None:
            return ServerUpdate(weights, state)
        local = LocalTraining(
            epochs=self.epochs, batch_size=self.batch_size, lr=self.lr, momentum=self.momentum, weight_decay=0.0
        )
        model = ctx.model(weights)
        batches = EpochBatches(self._split, self.batch_size, ctx.generator(f"{self.name}/batches"), epochs=self.epochs)
        fit = ctx.train(model, batches, local, purpose=self.name)
        return ServerUpdate(
            clone_weights(model.state_dict()),
            {"rounds_run": int(state.get("rounds_run", 0)) + 1},
            {"loss": fit.mean_loss, "steps": fit.num_steps},
        )


def run_server_steps(
    steps: Sequence[ServerStep], ctx: ServerContext, weights: Weights, states: Sequence[State]
) -> tuple[Weights, list[State], dict[str, Any]]:
    """Apply the server steps in order; returns the final weights, every step's new state, and their metrics."""
    new_states: list[State] = []
    metrics: dict[str, Any] = {}
    for step, state in zip(steps, states):
        update = step.step(ctx, weights, state)
        weights = update.weights
        new_states.append(update.state)
        metrics.update({f"{step.name}/{k}": v for k, v in update.metrics.items()})
    return weights, new_states, metrics


def check_step_names(steps: Sequence[ServerStep]) -> None:
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        raise ValueError(f"server_steps: two steps share a name ({names}); their metrics and state would collide")
