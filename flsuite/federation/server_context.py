"""`ServerContext`: what a method's server side and a server step may use in a round, as a contract.

The hooks that run after a round's clients have reported (`Method.aggregate`, `Method.server_update`,
`ServerStep.step`) receive it. The engine's implementation is `flsuite.federation.server.RoundServer` (built by
`RunContext.server_context`); the contract sits below both the method contract (`flsuite.federation.method`) and the
server, so the methods' types need nothing of the engine above them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from flsuite.data.base import EpochBatches
from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.task import ClientResult, LocalTraining, Weights

if TYPE_CHECKING:
    import lightning as L


class ServerContext(Protocol):
    """What the server has in round `round`: the round's results, a random stream derived from (seed, round,
    purpose) — the same under every executor, because it never touches the process's global RNG state that
    in-process clients advance — and `fit`/`train`, lean Lightning fits like a client's."""

    round: int
    seed: int
    results: Sequence[ClientResult]
    num_clients: int
    #: The accelerator of the run's local training (where a server-side fit runs).
    accelerator: str
    #: The global weights the round's clients started from (W_{t−1}); None outside a round.
    start_weights: Weights | None

    def seed_for(self, purpose: str) -> int:
        """The seed of the server stream (seed, round, purpose)."""
        ...

    def generator(self, purpose: str) -> torch.Generator:
        """A CPU generator for the server stream (seed, round, purpose)."""
        ...

    def model(self, weights: Weights) -> nn.Module:
        """A fresh model of the round's architecture holding `weights`."""
        ...

    def train(self, model: nn.Module, batches: EpochBatches, local: LocalTraining, purpose: str) -> FitStatistics:
        """Supervised training of `model` on the server (cross-entropy, `local`'s optimiser, the clients' lean loop
        over `batches`), seeded from `purpose`; returns the fit's statistics."""
        ...

    def fit(self, module: L.LightningModule, batches: EpochBatches, purpose: str) -> None:
        """One lean `Trainer.fit` of `module` over `batches`, with torch's global RNG seeded from the server stream."""
        ...
