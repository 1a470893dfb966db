"""The round loop. Every method runs through `Federation.fit`; it calls only the `Method` hooks, so it holds no
method-specific code.

One round: sample clients → build each client's task (global weights + the method's broadcast + that client's
state) → the executor runs each client's Lightning fit → store the clients' new states → the method aggregates →
optional server-side update → evaluate the global model on every domain → log → checkpoint.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from jsonargparse import lazy_instance
from tqdm.auto import tqdm

from flsuite.data.base import DataSource, FederatedData
from flsuite.federation.checkpoint import CHECKPOINT_NAME, FederationState, load_checkpoint, resolve_checkpoint, save_checkpoint
from flsuite.federation.client import ClientEnvironment
from flsuite.federation.executors import ClientFailure, Executor, SerialExecutor
from flsuite.federation.setup import SetupStage
from flsuite.federation.task import ClientResult, ClientTask, LocalTraining
from flsuite.federation.weights import clone_weights, is_finite, num_bytes
from flsuite.methods.base import Method
from flsuite.methods.fedavg import FedAvg
from flsuite.metrics import domain_table, evaluate, final_summary
from flsuite.models.heads import ModelSpec
from flsuite.seeding import derive_seed, numpy_rng
from flsuite.tracking import Tracker, WandbConfig, environment_info, write_json

log = logging.getLogger(__name__)


class ClientFailedError(RuntimeError):
    """A round could not proceed: a client failed under the "fail" policy, or no client update was usable."""


@dataclass
class ClientSampling:
    """Which clients train in each round (a seeded draw per round, without replacement).

    Args:
        fraction: Fraction of all clients sampled per round (at least one); 1.0 = full participation.
        per_round: Exact number of clients per round; overrides `fraction` when set.
    """

    fraction: float = 1.0
    per_round: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ValueError(f"sampling.fraction must be in (0, 1], got {self.fraction}")
        if self.per_round is not None and self.per_round < 1:
            raise ValueError(f"sampling.per_round must be >= 1, got {self.per_round}")

    def sample(self, num_clients: int, seed: int, round: int) -> list[int]:
        m = self.per_round if self.per_round is not None else max(1, round_half_up(self.fraction * num_clients))
        if m > num_clients:
            raise ValueError(f"sampling.per_round={m} but the federation has only {num_clients} clients")
        if m == num_clients:
            return list(range(num_clients))
        rng = numpy_rng(seed, round, purpose="sampling")
        return sorted(int(k) for k in rng.choice(num_clients, size=m, replace=False))


def round_half_up(x: float) -> int:
    return int(x + 0.5)


class Federation:
    """A federated experiment: data, model, method, local training, and how the run is executed and recorded.

    Args:
        data: Where the clients' and test data come from (a `DataSource`).
        model: The model every client trains (a `ModelSpec`, built for the data's input shape and classes).
        method: The FL method (server strategy + client module); FedAvg by default.
        rounds: Communication rounds.
        seed: Master seed; every random stream is derived from (seed, round, client, purpose).
        local: How each client trains locally per round.
        sampling: Which clients take part in each round.
        executor: Runs client fits (serial by default).
        setup: One-shot stages run before round 1 that may change the clients' data (e.g. GGEUR), in order.
        on_client_failure: What a round does when a client task still fails after the executor's retries: "fail"
            stops the run (the last round's checkpoint stays); "drop" aggregates the other clients and records the
            failed ones in the round's `clients_failed`. Updates with NaN/Inf weights are always rejected and recorded
            in `clients_rejected`.
        name: Experiment name: the run folder's parent and the W&B group (so seeds group together).
        output_dir: Where run folders are created (`<output_dir>/<name>/<time>-seed<seed>`).
        run_dir: Use exactly this run folder instead.
        checkpoint_every: Write a round checkpoint every this many rounds (and after the last).
        eval_every: Evaluate the global model every this many rounds (and after the last).
        last_k: Final numbers average the last k evaluated rounds (GGEUR's protocol: 5).
        target_acc: Report the first round whose acc_mean reaches this accuracy (%).
        eval_device: Device for evaluating the global model.
        progress: Show a progress bar over rounds.
        wandb: Weights & Biases logging.
    """

    def __init__(
        self,
        data: DataSource,
        model: ModelSpec,
        method: Method = lazy_instance(FedAvg),
        rounds: int = 10,
        seed: int = 0,
        local: LocalTraining = LocalTraining(),
        sampling: ClientSampling = ClientSampling(),
        executor: Executor = lazy_instance(SerialExecutor),
        setup: list[SetupStage] | None = None,
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
    ) -> None:
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        if checkpoint_every < 1 or eval_every < 1 or last_k < 1:
            raise ValueError("checkpoint_every, eval_every and last_k must be >= 1")
        self.data, self.model, self.method = data, model, method
        self.rounds, self.seed, self.local, self.sampling, self.executor = rounds, seed, local, sampling, executor
        self.setup = list(setup or [])
        if on_client_failure not in ("fail", "drop"):
            raise ValueError(f"on_client_failure must be 'fail' or 'drop', got {on_client_failure!r}")
        self.on_client_failure = on_client_failure
        self.name, self.output_dir, self.run_dir = name, Path(output_dir), Path(run_dir) if run_dir else None
        self.checkpoint_every, self.eval_every, self.last_k, self.target_acc = checkpoint_every, eval_every, last_k, target_acc
        self.eval_device, self.progress, self.wandb = eval_device, progress, wandb

    # ------------------------------------------------------------------------------------------------------------
    def resolve_run_dir(self, resume: Path | None = None) -> Path:
        """The run folder: the resumed run's, the configured one, or a new timestamped one."""
        if resume is not None:
            ckpt = resolve_checkpoint(resume)
            return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
        if self.run_dir is not None:
            return self.run_dir
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return self.output_dir / self.name / f"{stamp}-seed{self.seed}"

    def build_data(self) -> tuple[FederatedData, dict[str, float | int]]:
        """The federation's data after every setup stage, and the stages' metrics (prefixed by stage name)."""
        fed = self.data.build(self.seed)
        metrics: dict[str, float | int] = {}
        for stage in self.setup:
            start = time.perf_counter()
            result = stage.run(fed, self.seed)
            fed = result.data
            name = type(stage).__name__.lower()
            metrics.update({f"setup/{name}/{k}": v for k, v in result.metrics.items()})
            metrics[f"setup/{name}/seconds"] = time.perf_counter() - start
        return fed, metrics

    def _initial_state(self, fed: FederatedData) -> FederationState:
        torch.manual_seed(derive_seed(self.seed, purpose="model_init"))
        model = self.model.build(fed.input_shape, fed.num_classes)
        self.method.setup(model, len(fed.clients))
        weights = clone_weights(model.state_dict())
        return FederationState(
            round=0,
            global_weights=weights,
            server_state=self.method.init_server_state(weights),
            client_states={c.client_id: self.method.init_client_state(c.client_id, weights) for c in fed.clients},
        )

    def fit(self, resume: Path | None = None, config_yaml: str = "") -> dict[str, object]:
        """Run (or continue) the federation; returns the final summary. Writes the run folder as it goes."""
        run_dir = self.resolve_run_dir(resume)
        fed, setup_metrics = self.build_data()
        state = self._initial_state(fed)
        if resume is not None:
            state = self._resumed_state(resume, state, config_yaml)
        run_dir.mkdir(parents=True, exist_ok=True)
        if config_yaml and resume is None:
            (run_dir / "config.yaml").write_text(config_yaml)
        state.config_yaml = config_yaml or state.config_yaml
        write_json(run_dir / "environment.json", environment_info(self.seed))

        global_model = self.model.build(fed.input_shape, fed.num_classes)
        global_model.load_state_dict(state.global_weights)
        tracker = Tracker(run_dir, self.wandb, group=self.name, config=_config_dict(config_yaml))
        try:
            tracker.log_partition(fed.partition_stats())
            if self.setup:
                tracker.log_setup(setup_metrics)
            if resume is not None:
                tracker.rewrite_history(state.history, state.timings)
            self.executor.start(ClientEnvironment(fed, self.model, self.method, self.local, self.seed))
            bar = tqdm(total=self.rounds, initial=state.round, desc=self.name, disable=not self.progress, file=sys.stderr)
            for rnd in range(state.round + 1, self.rounds + 1):
                try:
                    record, timing = self._round(rnd, fed, state, global_model)
                except KeyboardInterrupt:
                    save_checkpoint(state, run_dir / "checkpoints" / CHECKPOINT_NAME)
                    log.warning("interrupted in round %d: checkpoint of round %d written; continue with --resume %s", rnd, state.round, run_dir)
                    raise
                state.round = rnd
                state.history.append(record)
                state.timings.append(timing)
                tracker.log_round(record, timing)
                if "acc_mean" in record:
                    bar.set_postfix(acc_mean=f"{record['acc_mean']:.2f}")
                bar.update(1)
                if rnd % self.checkpoint_every == 0 or rnd == self.rounds:
                    save_checkpoint(state, run_dir / "checkpoints" / CHECKPOINT_NAME)
            bar.close()
            summary = final_summary(state.history, self.last_k, self.target_acc)
            table = domain_table(summary, fed.domains, self.last_k)
            tracker.finish(summary, table, state.history, fed.domains)
        finally:
            tracker.close()
            self.executor.close()
        log.info("run folder: %s", run_dir)
        return summary | {"table": table, "run_dir": str(run_dir)}

    def _resumed_state(self, resume: Path, fresh: FederationState, config_yaml: str) -> FederationState:
        state = load_checkpoint(resume)
        expected = {k: tuple(v.shape) for k, v in fresh.global_weights.items()}
        found = {k: tuple(v.shape) for k, v in state.global_weights.items()}
        if expected != found:
            raise ValueError(f"--resume {resume}: the checkpoint's model does not match this config's model")
        if set(state.client_states) != set(fresh.client_states):
            raise ValueError(f"--resume {resume}: the checkpoint has {len(state.client_states)} clients, this config {len(fresh.client_states)}")
        if config_yaml and state.config_yaml and config_yaml != state.config_yaml:
            log.warning("--resume: the config differs from the checkpointed run's config; continuing with the new one")
        return state

    def _round(self, rnd: int, fed: FederatedData, state: FederationState, global_model: torch.nn.Module) -> tuple[dict, dict]:
        """One round. `state` is only updated at the end, so an interrupt mid-round leaves the last round's state."""
        t0 = time.perf_counter()
        sampled = self.sampling.sample(len(fed.clients), self.seed, rnd)
        broadcast = self.method.broadcast(rnd, state.server_state)
        tasks = [
            ClientTask(rnd, k, derive_seed(self.seed, rnd, k, "client"), state.global_weights, broadcast, state.client_states[k])
            for k in sampled
        ]
        outcomes = self.executor.run(tasks)
        t_clients = time.perf_counter() - t0
        failed = [o for o in outcomes if isinstance(o, ClientFailure)]
        if failed and self.on_client_failure == "fail":
            raise ClientFailedError(
                f"round {rnd}: client(s) {[f.client_id for f in failed]} failed after {failed[0].attempts} attempt(s): "
                f"{failed[0].error} (set on_client_failure: drop to continue without them)"
            )
        results = [o for o in outcomes if isinstance(o, ClientResult) and is_finite(o.weights)]
        rejected = [o.client_id for o in outcomes if isinstance(o, ClientResult) and not is_finite(o.weights)]
        if rejected:
            log.warning("round %d: rejected non-finite updates from client(s) %s", rnd, rejected)
        if not results:
            raise ClientFailedError(f"round {rnd}: no usable client update (failed {[f.client_id for f in failed]}, non-finite {rejected})")

        new_weights, server_state = self.method.aggregate(rnd, state.global_weights, results, state.server_state)
        global_model.load_state_dict(new_weights)
        server_metrics = self.method.server_update(rnd, global_model, server_state)
        state.global_weights = clone_weights(global_model.state_dict())
        state.server_state = server_state
        state.client_states.update({r.client_id: r.state for r in results})

        n_total = sum(r.num_samples for r in results)
        record: dict[str, object] = {
            "round": rnd,
            "clients": sampled,
            "clients_failed": [f.client_id for f in failed],
            "clients_rejected": rejected,
            "train_loss": sum(r.train_loss * r.num_samples for r in results) / n_total,
            "bytes_down": len(tasks) * (num_bytes(tasks[0].global_weights) + num_bytes(broadcast)),
            "bytes_up": sum(num_bytes(r.weights) + num_bytes(r.upload) for r in results),
            **{f"server/{k}": v for k, v in server_metrics.items()},
        }
        t_eval = time.perf_counter()
        if rnd % self.eval_every == 0 or rnd == self.rounds:
            record.update(evaluate(global_model, fed.test, fed.num_classes, device=self.eval_device))
        now = time.perf_counter()
        timing = {"round": rnd, "time/round_s": now - t0, "time/clients_s": t_clients, "time/eval_s": now - t_eval}
        return record, timing


def _config_dict(config_yaml: str) -> dict:
    if not config_yaml:
        return {}
    import yaml

    return yaml.safe_load(config_yaml) or {}
