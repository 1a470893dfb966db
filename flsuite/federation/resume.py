"""What `--resume` checks before it continues a run: the checkpointed state must fit this config's model, clients and
protocol (else a ValueError naming the checkpoint and what differs, before any round runs)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from flsuite.data.base import FederatedData
from flsuite.federation.phases import Phase, Rounds
from flsuite.federation.state import FederationState
from flsuite.models.heads import ModelSpec


def resumable_state(
    resume: Path, state: FederationState, fed: FederatedData, model: ModelSpec, protocol: Sequence[Phase]
) -> FederationState:
    """The checkpointed `state`, after checking that it fits this config's model, clients and protocol."""
    first = protocol[0]
    if state.phase == 0 and isinstance(first, Rounds) and first.model is None and first.clients is None:
        with torch.random.fork_rng(devices=[]):
            built = model.build(fed.input_shape, fed.num_classes)
        expected = {k: tuple(v.shape) for k, v in built.state_dict().items()}
        found = {k: tuple(v.shape) for k, v in state.global_weights.items()}
        if expected != found:
            raise ValueError(f"--resume {resume}: the checkpoint's model does not match this config's model")
        if set(state.client_states.ids) != set(range(len(fed.clients))):
            raise ValueError(
                f"--resume {resume}: the checkpoint has {len(state.client_states.ids)} clients, "
                f"this config {len(fed.clients)}"
            )
    if state.phase >= len(protocol):
        raise ValueError(
            f"--resume {resume}: the checkpoint is in phase {state.phase}, "
            f"this config's protocol has {len(protocol)} phases"
        )
    return state
