"""Executors run a round's client tasks. They hold no federation state: everything a client needs travels in its
`ClientTask` (and the run-constant `ClientEnvironment`), so any worker can run any client."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from flsuite.federation.client import ClientEnvironment, run_client
from flsuite.federation.task import ClientResult, ClientTask


class Executor(abc.ABC):
    """Runs client tasks; results come back in task order."""

    def start(self, env: ClientEnvironment) -> None:
        """Called once per run before the first round (e.g. to ship `env` to workers)."""
        self.env = env

    @abc.abstractmethod
    def run(self, tasks: Sequence[ClientTask]) -> list[ClientResult]: ...

    def close(self) -> None:
        """Release workers."""


class SerialExecutor(Executor):
    """Runs clients one after another in this process (the deterministic default)."""

    def run(self, tasks: Sequence[ClientTask]) -> list[ClientResult]:
        return [run_client(self.env, task) for task in tasks]
