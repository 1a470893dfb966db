"""Executors run a round's client tasks. They hold no federation state: everything a client needs travels in its
`ClientTask` (and the run-constant `ClientEnvironment`), so any worker can run any client.

A task that raises is retried up to `max_retries` times (its seed is in the task, so a retry computes exactly what the
first attempt would have); past that the executor returns a `ClientFailure` in its place and the round loop applies
its `on_client_failure` policy.
"""

from __future__ import annotations

import abc
import logging
import traceback
from collections.abc import Sequence

from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.query import QueryResult, QueryTask, run_query
from flsuite.federation.task import ClientFailure, ClientResult, ClientTask

__all__ = ["Executor", "SerialExecutor"]

log = logging.getLogger(__name__)


class Executor(abc.ABC):
    """Runs client tasks; results (or failures) come back in task order.

    Args:
        max_retries: Extra attempts for a client task that raises (or whose worker dies) before it counts as failed.
    """

    def __init__(self, max_retries: int = 1) -> None:
        if max_retries < 0:
            raise ValueError(f"executor max_retries must be >= 0, got {max_retries}")
        self.max_retries = max_retries

    def start(self, env: ClientEnvironment) -> None:
        """Called once per run before anything else (e.g. to start workers and ship `env` to them)."""
        self.env = env

    @property
    def processes(self) -> int:
        """How many processes run client fits side by side (each compiles its own graphs); this one: 1."""
        return 1

    def set_env(self, env: ClientEnvironment) -> None:
        """A protocol phase changed what clients work with (data after a setup stage, another model or method)."""
        self.env = env

    @abc.abstractmethod
    def run(self, tasks: Sequence[ClientTask]) -> list[ClientResult | ClientFailure]: ...

    @abc.abstractmethod
    def query(self, tasks: Sequence[QueryTask]) -> list[QueryResult | ClientFailure]:
        """Run one-shot client queries (see `flsuite.federation.query`), with the same retry policy as fits."""

    def close(self) -> None:
        """Release workers."""


class SerialExecutor(Executor):
    """Runs clients one after another in this process (the deterministic default)."""

    def run(self, tasks: Sequence[ClientTask]) -> list[ClientResult | ClientFailure]:
        return [self._run_with_retries(run_client, task) for task in tasks]

    def query(self, tasks: Sequence[QueryTask]) -> list[QueryResult | ClientFailure]:
        return [self._run_with_retries(run_query, task) for task in tasks]

    def _run_with_retries(self, fn, task):
        for attempt in range(1, self.max_retries + 2):
            try:
                return fn(self.env, task)
            except Exception as err:  # noqa: BLE001 - any client error is retried, then reported as a failure
                log.warning("client %d, round %d, attempt %d failed: %s", task.client_id, task.round, attempt, err)
                last = "".join(traceback.format_exception_only(err)).strip()
        return ClientFailure(task.client_id, task.round, last, attempt)
