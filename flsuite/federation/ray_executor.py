"""Run client fits on Ray actors: one machine's cores, or a multi-node cluster (see docs/scale-out.md).

Workers are Ray actors (`flsuite.federation.ray_workers.ClientWorker`) created once per run (`start`) and reused
across rounds (and across runs of one driver with `keep_workers`). The run-constant
`ClientEnvironment` (data, model spec, method, local training) goes into the object store once and each actor keeps
it; each round the global weights and the method's broadcast are put into the object store once and passed to every
client by reference, so a task carries only the client id, round, seed and that client's state.

Results are deterministic and equal to `SerialExecutor`'s: each client's randomness comes from the seed in its task.

Ray is imported lazily (`flsuite.federation.ray_start`), so this module imports without it; `python -m pip install
-e ".[ray]"` installs it.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from flsuite.federation.executors import Executor
from flsuite.federation.local.client import ClientEnvironment
from flsuite.federation.query import QueryResult, QueryTask
from flsuite.federation.ray_start import import_ray, quiet_local_token_notice
from flsuite.federation.ray_workers import ClientWorker, WorkerKind, leave_idle, take_idle_workers
from flsuite.federation.task import ClientFailure, ClientResult, ClientTask

log = logging.getLogger(__name__)

#: Calls queued per worker at once: the next client's inputs are already there when a worker finishes one.
_DEPTH = 2
#: How long `start` waits for the workers to come up before going on with those that did.
_READY_TIMEOUT_S = 300.0


class RayExecutor(Executor):
    """Runs client fits in parallel on Ray actors (local cores or a cluster).

    A client task that raises is retried up to `max_retries` times on the same worker; a worker that dies (its
    process exits or its node goes away) is replaced by a fresh one and the task is retried, which also counts as an
    attempt. Past that the client is reported as failed (see the federation's `on_client_failure`).

    Args:
        address: Ray cluster to use: null starts a local Ray on this machine (stopped again by `close`); "auto"
            attaches to the cluster this machine belongs to (started with `ray start`); "ray://<head>:10001"
            attaches through Ray Client (needs `pip install 'ray[client]'`). If Ray is already initialised in this
            process, that instance is used as is.
        num_cpus: CPUs the local Ray may use (null: all); only for a local Ray (`address: null`).
        num_workers: Worker actors (clients trained at once); null: as many as the cluster's CPUs (and GPUs) allow
            for `cpus_per_client` / `gpus_per_client`.
        cpus_per_client: CPUs reserved per worker.
        gpus_per_client: GPUs reserved per worker (fractions share a GPU); set `local.accelerator: gpu` to use them.
        max_retries: Extra attempts for a client task that raises or whose worker dies.
        torch_threads: Intra-op threads of each worker's torch: "auto" (`flsuite.runtime.ThreadPolicy` over the
            worker's `cpus_per_client`: one thread per 0.1 GFLOP of a batch's forward pass, at most
            `floor(cpus_per_client)`), a count, or 0 (torch's default). The FLSUITE_THREADS variable overrides it.
        spread: Place the workers (and any replacement) across the cluster's nodes (Ray's "SPREAD" scheduling)
            instead of Ray's default, which fills the driver's node first.
        keep_workers: On a Ray this executor did not start (the caller's `ray.init`), leave the workers idle at
            `close` for the next RayExecutor of this process with the same resources, instead of stopping them (a
            new worker imports torch, Lightning and flsuite: seconds). Idle workers keep their CPUs reserved until
            taken, `flsuite.federation.ray_workers.release_idle_workers()` or `ray.shutdown()`.
    """

    def __init__(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        num_workers: int | None = None,
        cpus_per_client: float = 1.0,
        gpus_per_client: float = 0.0,
        max_retries: int = 1,
        torch_threads: int | Literal["auto"] = "auto",
        spread: bool = False,
        keep_workers: bool = False,
    ) -> None:
        super().__init__(max_retries=max_retries)
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"RayExecutor num_workers must be >= 1 or null, got {num_workers}")
        if cpus_per_client < 0 or gpus_per_client < 0:
            raise ValueError("RayExecutor cpus_per_client and gpus_per_client must be >= 0")
        if num_cpus is not None and address is not None:
            raise ValueError("RayExecutor num_cpus applies to a local Ray only (address: null)")
        if torch_threads != "auto" and (not isinstance(torch_threads, int) or torch_threads < 0):
            raise ValueError(f"RayExecutor torch_threads must be 'auto' or an integer >= 0, got {torch_threads!r}")
        self.address, self.num_cpus, self.num_workers = address, num_cpus, num_workers
        self.cpus_per_client, self.gpus_per_client, self.torch_threads = cpus_per_client, gpus_per_client, torch_threads
        self.spread, self.keep_workers = spread, keep_workers
        self._owns_ray = False
        self._actors: list[Any] = []
        self._env_ref = None
        self._kind: WorkerKind | None = None

    # ------------------------------------------------------------------------------------------------------------
    def start(self, env: ClientEnvironment) -> None:
        super().start(env)
        ray = import_ray()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"address": self.address}
            if self.address is None:
                kwargs.update(num_cpus=self.num_cpus, include_dashboard=False)
            with quiet_local_token_notice(self.address is None):
                ray.init(**kwargs)
            self._owns_ray = True
        placement = {"scheduling_strategy": "SPREAD"} if self.spread else {}
        self._actor_cls = ray.remote(ClientWorker).options(
            num_cpus=self.cpus_per_client,
            num_gpus=self.gpus_per_client,
            max_restarts=0,
            max_task_retries=0,
            **placement,
        )
        self._env_ref = ray.put(self.env)
        context = ray.get_runtime_context()
        self._kind = WorkerKind(
            f"{context.get_node_id()}/{context.get_job_id()}", self.cpus_per_client, self.gpus_per_client, self.spread
        )
        n = self.num_workers or self._default_num_workers(ray)
        idle = take_idle_workers(self._kind, n)
        up = self._wait_up(ray, dict(self._configure(idle)), "an idle Ray worker was gone")
        reused = len(up)
        up += self._wait_up(
            ray,
            {a.ready.remote(): a for a in (self._new_actor() for _ in range(n - reused))},
            "a Ray worker failed to start",
        )
        if not up:
            raise RuntimeError(f"RayExecutor: none of {n} workers started (resources: {ray.available_resources()})")
        if len(up) < n:
            log.warning(
                "RayExecutor: %d of %d workers started (not enough resources?); going on with those", len(up), n
            )
        self._actors = up
        log.info("RayExecutor: %d workers%s", len(up), f" ({reused} reused)" if reused else "")

    def _configure(self, idle: list[Any]) -> Iterator[tuple[Any, Any]]:
        """(call, worker) for each idle worker Ray still accepts a call for (one it lost is refused at submission)."""
        for worker in idle:
            try:
                yield worker.configure.remote(self._env_ref, self.torch_threads), worker
            except Exception as err:  # noqa: BLE001 - Ray raises a plain Exception for an actor it no longer knows
                log.info("an idle Ray worker was gone: %s", err)

    @staticmethod
    def _wait_up(ray, calls: dict[Any, Any], failure: str) -> list[Any]:
        """The workers whose call in `calls` ({ref: worker}) returned within the start timeout; the others are
        stopped."""
        if not calls:
            return []
        done, pending = ray.wait(list(calls), num_returns=len(calls), timeout=_READY_TIMEOUT_S)
        up = []
        for ref in done:
            try:
                ray.get(ref)
                up.append(calls[ref])
            except ray.exceptions.RayError as err:
                log.warning("%s: %s", failure, err)
        for ref in pending:
            ray.kill(calls[ref], no_restart=True)
        return up

    @property
    def processes(self) -> int:
        """The workers started (each a process of its own), or those asked for before `start`."""
        return len(self._actors) if self._actors else max(1, self.num_workers or 1)

    def _default_num_workers(self, ray) -> int:
        resources = ray.cluster_resources()
        limits = []
        if self.cpus_per_client > 0:
            limits.append(int(resources.get("CPU", 1) // self.cpus_per_client))
        if self.gpus_per_client > 0:
            limits.append(int(resources.get("GPU", 0) // self.gpus_per_client))
        return max(1, min(limits)) if limits else max(1, int(resources.get("CPU", 1)))

    def _new_actor(self):
        return self._actor_cls.remote(self._env_ref, self.torch_threads)

    def set_env(self, env: ClientEnvironment) -> None:
        """Ship the new environment once through the object store; every worker (and any replacement) takes it."""
        super().set_env(env)
        if not self._actors:
            return
        ray = import_ray()
        self._env_ref = ray.put(env)
        ray.get([a.set_env.remote(self._env_ref) for a in self._actors])

    # ------------------------------------------------------------------------------------------------------------
    def run(self, tasks: Sequence[ClientTask]) -> list[ClientResult | ClientFailure]:
        ray = import_ray()
        shared: dict[tuple[int, int, int], Any] = {}  # one object-store copy per distinct (weights, broadcast, held)

        def submit(actor, t: ClientTask):
            key = (id(t.global_weights), id(t.broadcast), id(t.held))
            if key not in shared:
                shared[key] = ray.put((t.global_weights, t.broadcast, t.held))
            return actor.run.remote(shared[key], t.round, t.client_id, t.seed, t.state)

        return self._dispatch(tasks, submit)

    def query(self, tasks: Sequence[QueryTask]) -> list[QueryResult | ClientFailure]:
        return self._dispatch(tasks, lambda actor, t: actor.query.remote(t))

    def _dispatch(self, tasks, submit) -> list:
        """Run `submit(actor, task)` for every task on the workers, with retries and dead-worker replacement."""
        if not self._actors:
            raise RuntimeError("RayExecutor.run called before start()")
        ray = import_ray()
        outcomes: list[ClientResult | ClientFailure | None] = [None] * len(tasks)
        attempts = [0] * len(tasks)
        queue = deque(range(len(tasks)))
        busy = [0] * len(self._actors)  # calls in flight per worker (up to _DEPTH, so a worker never waits on us)
        in_flight: dict[Any, tuple[int, int, Any]] = {}

        while queue or in_flight:
            while queue and min(busy) < _DEPTH:
                slot = min(range(len(busy)), key=busy.__getitem__)
                i, actor = queue.popleft(), self._actors[slot]
                t = tasks[i]
                attempts[i] += 1
                busy[slot] += 1
                ref = submit(actor, t)
                in_flight[ref] = (i, slot, actor)
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in done:
                i, slot, actor = in_flight.pop(ref)
                busy[slot] -= 1
                try:
                    outcomes[i] = ray.get(ref)
                except ray.exceptions.RayActorError as err:
                    if self._actors[slot] is actor:  # the first of its calls to report the death replaces it
                        self._replace_actor(slot)
                    self._retry_or_fail(i, tasks[i], attempts[i], err, queue, outcomes, "worker died")
                except ray.exceptions.RayError as err:
                    self._retry_or_fail(i, tasks[i], attempts[i], err, queue, outcomes, "raised")
        return outcomes

    def _retry_or_fail(self, i, task, attempt, err, queue, outcomes, what) -> None:
        cause = getattr(err, "cause", None) or err
        message = "".join(traceback.format_exception_only(cause)).strip()
        log.warning("client %d, round %d, attempt %d %s: %s", task.client_id, task.round, attempt, what, message)
        if attempt <= self.max_retries:
            queue.append(i)
        else:
            outcomes[i] = ClientFailure(task.client_id, task.round, message, attempt)

    def _replace_actor(self, slot: int) -> None:
        ray = import_ray()
        try:
            ray.kill(self._actors[slot], no_restart=True)
        except Exception:  # noqa: BLE001 - it is already gone
            pass
        self._actors[slot] = self._new_actor()

    def close(self) -> None:
        if not self._actors and not self._owns_ray:
            return
        ray = import_ray()
        if self.keep_workers and self._kind is not None and not self._owns_ray and ray.is_initialized():
            leave_idle(self._kind, self._actors)
        else:
            for actor in self._actors:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001 - best effort
                    pass
        self._actors, self._env_ref = [], None
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        self._owns_ray = False
