"""Setup stages: one-shot protocols that run after the data is built and before round 1.

A stage may change what clients train on (GGEUR's augmentation) and reports what it communicated. What a client
sends goes through a client query (`flsuite.federation.query`), run by the run's executor, so uploads are counted
from the payloads themselves. Stages are deterministic given the seed, so a resumed run simply runs them again.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from flsuite.data.base import FederatedData
from flsuite.federation.query import QueryRunner


@dataclass
class SetupResult:
    """The (possibly changed) federation data and the stage's metrics (bytes each way, seconds, counts)."""

    data: FederatedData
    metrics: dict[str, float | int] = field(default_factory=dict)
    #: One line for the console saying what the stage did (e.g. "79,239 embeddings generated").
    message: str = ""


class SetupStage(abc.ABC):
    """A protocol run once before federated training (clients summarise → server combines → clients receive)."""

    @abc.abstractmethod
    def run(self, data: FederatedData, seed: int, query: QueryRunner | None = None) -> SetupResult:
        """`query` runs client queries (the run's executor); None runs them in this process."""
