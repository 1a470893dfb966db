"""Ray's worker side: the actor that runs one client task per call, and the workers a finished run may leave idle for
the next run of the same driver process (`RayExecutor(keep_workers=True)`).

A worker's process imports torch, Lightning and flsuite when it starts (seconds on a busy machine); a driver that runs
many federations on one Ray (a Python loop over configs, the test suite) can hand its workers from one run to the next
instead. What a worker holds between runs is configuration, not state: the run's `ClientEnvironment` and torch's
thread counts are set again by `configure` (the thread policy recomputed for the new environment), every task carries
its client's state and seed, and each client's randomness comes from that seed, so a reused worker computes what a
new one would (tests/federation/test_ray_executor.py compares both with the serial executor to the bit).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.query import QueryResult, QueryTask, run_query
from flsuite.federation.task import ClientResult, ClientTask, State


class ClientWorker:
    """A Ray actor that keeps the run's environment and runs one client task per call."""

    def __init__(self, env: ClientEnvironment, torch_threads: int | Literal["auto"]) -> None:
        self.configure(env, torch_threads)

    def configure(self, env: ClientEnvironment, torch_threads: int | Literal["auto"]) -> int:
        """Take a run's environment and set torch's threads for it; returns the process id (the worker is up)."""
        if torch_threads != 0:  # 0: leave torch's default
            import ray

            from flsuite.runtime import ThreadPolicy

            # The worker's share of the cores is the CPUs Ray assigned it (cpus_per_client), not the machine's.
            cores = int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)) or 1
            ThreadPolicy(intra_op=torch_threads).apply(env.step_flops(), cores=cores, spare=0)
        self.env = env
        return os.getpid()

    def ready(self) -> int:
        return os.getpid()

    def run(
        self, shared: tuple[dict, dict[str, Any], dict], round: int, client_id: int, seed: int, state: State
    ) -> ClientResult:
        global_weights, broadcast, held = shared
        return run_client(self.env, ClientTask(round, client_id, seed, global_weights, broadcast, state, held))

    def set_env(self, env: ClientEnvironment) -> None:
        self.env = env

    def query(self, task: QueryTask) -> QueryResult:
        return run_query(self.env, task)


@dataclass(frozen=True)
class WorkerKind:
    """What a worker was made with besides its environment: the Ray session it lives in (the driver's node id and job
    id: a new local Ray numbers its jobs from 1 again, its node id is new) and the resources and placement Ray gave
    it. Only a worker of the same kind is handed to a new run."""

    session: str
    cpus: float
    gpus: float
    spread: bool


_IDLE: dict[WorkerKind, list[Any]] = {}


def take_idle_workers(kind: WorkerKind, n: int) -> list[Any]:
    """Up to `n` idle workers of `kind` (removed from the pool); the pools of other Ray sessions are dropped (their
    workers went with their session)."""
    for other in [k for k in _IDLE if k.session != kind.session]:
        del _IDLE[other]
    pool = _IDLE.get(kind, [])
    taken, _IDLE[kind] = pool[:n], pool[n:]
    return taken


def leave_idle(kind: WorkerKind, workers: list[Any]) -> None:
    """Keep `workers` for the next run of this process on the same Ray session (they keep their CPUs reserved)."""
    _IDLE.setdefault(kind, []).extend(workers)


def release_idle_workers() -> int:
    """Stop every idle worker of this process (freeing their CPUs); how many were stopped."""
    import ray

    workers = [w for pool in _IDLE.values() for w in pool]
    _IDLE.clear()
    if ray.is_initialized():
        for worker in workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
    return len(workers)
