"""What travels between the server and a client besides uploads and broadcasts: the state-dict entries a method
declares (`Method.weights_up`, `weights_down`, `kept_on_client`), which the engine carries and counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from flsuite.federation.task import Weights

Travel = Literal["all", "trainable", "buffers"]


@dataclass(frozen=True)
class Transport:
    """Which state-dict entries of the model travel each way besides the upload and broadcast, as a method declares
    them (`Method.weights_up`, `weights_down`, `kept_on_client`). The engine carries exactly these: a client's result
    holds only `upward` weights (the rest never leaves it, never reaches `aggregate`), a task carries only the
    `downward` ones, and `kept` entries travel neither way.

    Args:
        up, down: "all", "trainable" (the entries of `trainable`) or "buffers" (the floating-point entries that are
            not trainable parameters, e.g. BatchNorm statistics).
        trainable: The state-dict names of the trainable parameters (`Method.parameter_names`).
        kept: Entries that stay on the client whatever `up` and `down` say (FedSR's own reference Gaussians).
    """

    up: Travel = "all"
    down: Travel = "all"
    trainable: tuple[str, ...] = ()
    kept: frozenset[str] = frozenset()

    def travelling(self, weights: Weights, which: Travel) -> Weights:
        """The entries of `weights` that travel under `which`, never a `kept` one (`weights` itself when all do)."""
        if which == "all":
            return (
                {n: w for n, w in weights.items() if n not in self.kept} if self.kept.intersection(weights) else weights
            )
        if which == "trainable":
            return {n: weights[n] for n in self.trainable if n not in self.kept}
        trained = set(self.trainable) | self.kept
        return {n: w for n, w in weights.items() if n not in trained and torch.is_floating_point(w)}

    def upward(self, weights: Weights) -> Weights:
        """What of a client's weights its result carries to the server."""
        return self.travelling(weights, self.up)

    def downward(self, weights: Weights) -> tuple[Weights, Weights]:
        """The global weights split for a task: (carried: what travels down, held: what the client already holds
        and is not sent, e.g. the frozen part under `down: trainable`). `kept` entries are in neither: the client
        trains its own (the model's initial values, or what the method restores from the client's state)."""
        carried = self.travelling(weights, self.down)
        held = {n: w for n, w in weights.items() if n not in carried and n not in self.kept}
        return carried, held
