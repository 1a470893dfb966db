"""The run: `Federation` holds an experiment's settings and runs it — the run folder, the tracker, the executor's
lifetime, checkpoints and resume — as a protocol of phases (`flsuite.federation.phases`), each given a `RunContext`
(`flsuite.federation.context`). The default protocol is setup stages, then rounds of the method (`Rounds`, where
the round loop lives). The run holds no method-specific code.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal

import yaml
from jsonargparse import lazy_instance

from flsuite.data.base import DataSource, FederatedData
from flsuite.data.validation import ValidationSplit
from flsuite.federation.checkpoint import load_checkpoint, resolve_checkpoint, run_dir_of
from flsuite.federation.context import RunContext, RunSettings
from flsuite.federation.executors import Executor, SerialExecutor
from flsuite.federation.local.choice import resolved
from flsuite.federation.local.client import ClientEnvironment
from flsuite.federation.method import HyperParameters, Method
from flsuite.federation.phases import Phase, Rounds, own_protocol
from flsuite.federation.resume import resumable_state
from flsuite.federation.run_loop_choice import run_loop_choice
from flsuite.federation.sampling import ClientSampling
from flsuite.federation.server import ServerStep, check_step_names
from flsuite.federation.setup import SetupStage
from flsuite.federation.state import FederationState
from flsuite.federation.summary import run_summary
from flsuite.federation.task import LocalTraining
from flsuite.interrupts import RunInterrupted, note_run_dir
from flsuite.metrics import domain_table
from flsuite.models.heads import ModelSpec
from flsuite.preflight import check_run
from flsuite.progress import shown as progress_shown
from flsuite.run_environment import environment_info, record_environment
from flsuite.runfolder import check_run_dir_free, create_run_dir, write_config
from flsuite.runtime import ThreadPolicy
from flsuite.seeding import resolve_seeds
from flsuite.tracking import Tracker, WandbConfig, run_labels

log = logging.getLogger(__name__)

__all__ = ["Federation"]


class Federation:
    """A federated experiment: data, model, method, local training, and how the run is executed and recorded.

    Args:
        data: Where the clients' and test data come from (a `DataSource`).
        model: The model every client trains (a `ModelSpec`, built for the data's input shape and classes).
        validation: A validation split held out of every client's training split (`fraction`, 0 = none), evaluated
            as `val/` metrics: what hyperparameters are chosen on, never the test set (`flsuite.data.validation`).
        method: The FL method (server strategy + client module); null: the base `Method`, whose hooks are FedAvg's
            (the command line's default is `flsuite.methods.fedavg.FedAvg`, the same numbers).
        rounds: Communication rounds.
        seed: Master seed: the data seed and the training seed unless `data_seed` / `train_seed` set them; every
            random stream is derived from (one of the two, round, client, purpose) (`flsuite.seeding.Seeds`).
        data_seed: Seed of the clients' data (partition, seeded subsets and test splits, validation split, server-held
            data); null: `seed`. Fix it and vary `train_seed` to repeat training on the same clients.
        train_seed: Seed of the training (initialisation, client sampling, batch order and augmentation, client
            queries, setup stages, server streams); null: `seed`.
        local: How each client trains locally per round.
        sampling: Which clients take part in each round.
        executor: Runs client fits (serial by default).
        setup: One-shot stages run before round 1 that may change the clients' data (e.g. GGEUR), in order.
        server_steps: Server-side steps run after every aggregation, in order, composable with any method.
        protocol: The phases of the run, in order; null: the method's own protocol (`Method.protocol`), which by
            default is rounds of `method` over all clients (`Rounds()`).
        on_client_failure: What a round does when a client task still fails after the executor's retries: "fail"
            stops the run (the last round's checkpoint stays); "drop" aggregates the other clients and records the
            failed ones in the round's `clients_failed`. Updates with NaN/Inf weights are always rejected and recorded
            in `clients_rejected`.
        name: Experiment name: the run folder's parent and the W&B group (so seeds group together).
        output_dir: Where run folders are created (`<output_dir>/<name>/<time>-seed<seed>`, plus `-data<d>` /
            `-train<t>` when a seed is overridden).
        run_dir: Use exactly this run folder instead.
        checkpoint_every: Write a round checkpoint every this many rounds (and after the last).
        eval_every: Evaluate the global model every this many rounds (and after the last).
        last_k: Final numbers average the last k evaluated rounds (GGEUR's protocol: 5).
        target_acc: Report the first round whose acc_mean reaches this accuracy (%).
        eval_device: Device for evaluating the global model.
        progress: Show progress on stderr: a bar over rounds, and over the run's other long phases (feature
            extraction, setup stages, client queries, server-side fits).
        wandb: Weights & Biases logging.
        threads: torch's thread counts in this process (`flsuite.runtime.ThreadPolicy`; auto: one thread per 0.1
            GFLOP of a training batch's forward pass, at most this process's share of the cores but one: 1 on 2 cores,
            and for small models and heads on feature vectors anywhere; the FLSUITE_THREADS variable overrides).
    """

    def __init__(
        self,
        data: DataSource,
        model: ModelSpec,
        validation: ValidationSplit = ValidationSplit(),
        method: Method | None = None,
        rounds: int = 10,
        seed: int = 0,
        data_seed: int | None = None,
        train_seed: int | None = None,
        local: LocalTraining = LocalTraining(),
        sampling: ClientSampling = ClientSampling(),
        executor: Executor = lazy_instance(SerialExecutor),
        setup: list[SetupStage] | None = None,
        server_steps: list[ServerStep] | None = None,
        protocol: list[Phase] | None = None,
        on_client_failure: Literal["fail", "drop"] = "fail",
        name: str = "flsuite",
        output_dir: Path = Path("runs"),
        run_dir: Path | None = None,
        checkpoint_every: int = 1,
        eval_every: int = 1,
        last_k: int = 5,
        target_acc: float | None = None,
        eval_device: str = "cpu",
        progress: bool = True,
        wandb: WandbConfig = WandbConfig(),
        threads: ThreadPolicy = ThreadPolicy(),
    ) -> None:
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        if checkpoint_every < 1 or eval_every < 1 or last_k < 1:
            raise ValueError("checkpoint_every, eval_every and last_k must be >= 1")
        self.data, self.model, self.method = data, model, method if method is not None else Method()
        self.seeds = resolve_seeds(seed, data_seed, train_seed)  # checked before any work
        self.rounds, self.seed, self.local, self.sampling, self.executor = rounds, seed, local, sampling, executor
        self.setup, self.server_steps = list(setup or []), list(server_steps or [])
        self.protocol: list[Phase] = list(protocol or own_protocol(self.method) or [Rounds()])
        check_step_names(self.server_steps)
        if len({p.name for p in self.protocol}) != len(self.protocol):
            raise ValueError(f"protocol: phase names must be distinct, got {[p.name for p in self.protocol]}")
        if on_client_failure not in ("fail", "drop"):
            raise ValueError(f"on_client_failure must be 'fail' or 'drop', got {on_client_failure!r}")
        self.on_client_failure = on_client_failure
        self.name, self.output_dir, self.run_dir = name, Path(output_dir), Path(run_dir) if run_dir else None
        self.checkpoint_every, self.eval_every, self.last_k, self.target_acc = (
            checkpoint_every,
            eval_every,
            last_k,
            target_acc,
        )
        self.eval_device, self.progress, self.wandb = eval_device, progress, wandb
        self.threads, self.validation = threads, validation

    # ------------------------------------------------------------------------------------------------------------
    def resolve_run_dir(self, resume: Path | None = None) -> Path | None:
        """The run folder, checked, not created: the resumed run's, the configured one (refused if it holds a run), or
        None for a new one."""
        if resume is not None:
            return run_dir_of(resolve_checkpoint(resume))
        if self.run_dir is not None:
            return check_run_dir_free(self.run_dir)
        return None

    def build_data(self, query=None) -> tuple[FederatedData, dict[str, float | int]]:
        """The federation's data after every setup stage, and the stages' metrics (prefixed by stage name).

        `query` runs the stages' client queries (the run's executor); None: in this process.
        """
        return self._setup(self.raw_data(), query)

    def raw_data(self) -> FederatedData:
        """The federation's data before any setup stage: the source's build and the validation split, both drawn from
        the data seed."""
        return self.validation.apply(self.data.build(self.seeds.data), self.seeds.data)

    def _setup(self, fed: FederatedData, query=None) -> tuple[FederatedData, dict[str, float | int]]:
        metrics: dict[str, float | int] = {}
        for stage in self.setup:
            start = time.perf_counter()
            result = stage.run(fed, self.seeds.train, query=query)
            fed = result.data
            name = type(stage).__name__.lower()
            metrics.update({f"setup/{name}/{k}": v for k, v in result.metrics.items()})
            metrics[f"setup/{name}/seconds"] = time.perf_counter() - start
            log.info(
                "%s: %s in %.1f s",
                type(stage).__name__,
                result.message or ", ".join(f"{k} {v}" for k, v in result.metrics.items()),
                metrics[f"setup/{name}/seconds"],
            )
            if query is not None:
                self.executor.set_env(self._env(fed))
        return fed, metrics

    def _env(self, fed: FederatedData) -> ClientEnvironment:
        return ClientEnvironment(fed, self.model, HyperParameters(self.method), self.local, self.seeds.train)

    def settings(self, local: LocalTraining | None = None) -> RunSettings:
        """What the phases read of this run; `local`: the local training with its loop chosen (default: as
        configured)."""
        return RunSettings(
            seed=self.seeds.train,
            data_seed=self.seeds.data,
            rounds=self.rounds,
            model=self.model,
            method=self.method,
            local=local or self.local,
            sampling=self.sampling,
            server_steps=tuple(self.server_steps),
            on_client_failure=self.on_client_failure,
            checkpoint_every=self.checkpoint_every,
            eval_every=self.eval_every,
            eval_device=self.eval_device,
            progress=self.progress,
            name=self.name,
        )

    def fit(self, resume: Path | None = None, config_yaml: str = "") -> dict[str, object]:
        """Run (or continue) the protocol; returns the final summary. Writes the run folder as it goes. Progress
        (`progress`) is shown for the whole run, data building included (`flsuite.progress`)."""
        with progress_shown(self.progress):
            return self._fit(resume, config_yaml)

    def _fit(self, resume: Path | None, config_yaml: str) -> dict[str, object]:
        """Errors before work: the run folder is checked, the settings checked (`flsuite.preflight`), the data built
        and set up; only then are the folder and the W&B run created (flsuite.runfolder's decisions)."""
        planned = self.resolve_run_dir(resume)
        check_run(self.model, self.local.accelerator, self.eval_device)
        loaded = load_checkpoint(resume) if resume is not None else None
        raw = self.raw_data()  # validation held out before any setup stage sees it
        self.threads.apply(self._env(raw).step_flops())
        self.executor.start(self._env(raw))
        try:
            fed, setup_metrics = self._setup(raw, query=self.executor.query)
            state = FederationState.empty()
            if resume is not None and loaded is not None:
                state = resumable_state(resume, loaded, fed, self.model, self.protocol)
            run_dir = create_run_dir(planned, self.output_dir, self.name, self.seeds.label(self.seed))
            if config_yaml:
                write_config(run_dir, config_yaml, resumed=resume is not None)
            choice = run_loop_choice(
                self, fed, state
            )  # before the config is replaced: a resumed run's own config may name its loop
            state.config_yaml = config_yaml or state.config_yaml
            resumed_at = {"phase": state.phase, "round": state.round} if resume is not None else None
            record_environment(
                run_dir, environment_info(self.seed, self.seeds) | {"local_loop": choice.as_record()}, resumed_at
            )
            tracker = Tracker(
                run_dir,
                self.wandb,
                group=self.name,
                config=yaml.safe_load(config_yaml or "{}") or {},
                labels=run_labels(self.method, self.data, self.setup),
            )
            try:
                tracker.log_partition(fed.partition_stats())
                if self.setup:
                    tracker.log_setup(setup_metrics)
                if resume is not None:
                    tracker.rewrite_history(state.history, state.timings)
                ctx = RunContext(self.settings(resolved(self.local, choice)), fed, state, self.executor, tracker)
                try:
                    for i, phase in enumerate(self.protocol):
                        if i < state.phase:
                            continue
                        if i > state.phase:
                            state.enter_phase(i)
                        phase.run(ctx)
                except (KeyboardInterrupt, RunInterrupted) as interrupt:
                    note_run_dir(interrupt, run_dir)
                    ctx.checkpoint()
                    phase_name = self.protocol[state.phase].name
                    log.warning(
                        "interrupted: checkpoint of %s round %d written; continue with --resume %s",
                        phase_name,
                        state.round,
                        run_dir,
                    )
                    raise
                summary, records = run_summary(self.protocol, state, self.last_k, self.target_acc)
                table = domain_table(summary, fed.domains, self.last_k) if summary else ""
                tracker.finish(summary, table, records, fed.domains)
            finally:
                tracker.close()
        finally:
            self.executor.close()
        log.info("run folder: %s", run_dir)
        return summary | {"table": table, "run_dir": str(run_dir)}
