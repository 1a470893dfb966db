"""Round checkpoints: everything needed to continue a federation, stored as tensors and plain containers so they load
with `torch.load(weights_only=True)` (no arbitrary unpickling).

Randomness is derived from (seed, round, client, purpose), so no RNG state needs saving: the round number is enough.
Client states are not in the checkpoint file itself but one file per client beside it, written when they change
(`flsuite.federation.client_states`); the checkpoint names them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from flsuite.federation.client_states import ClientStates
from flsuite.federation.task import State, Weights

FORMAT_VERSION = 3
#: Formats this version reads (1: before protocols of phases, such a checkpoint is phase 0 of the default protocol;
#: 2: every client's state inside the checkpoint file).
READABLE_FORMATS = (1, 2, 3)
CHECKPOINT_NAME = "last.pt"
#: The folder of the client-state files, beside the checkpoint.
CLIENTS_DIR = "clients"


class CheckpointError(ValueError):
    """A checkpoint that cannot be found or does not fit this run."""


@dataclass
class FederationState:
    """The whole run after `round` completed rounds of phase `phase` (an index into the protocol).

    `global_weights`, `server_state`, `client_states`, `step_states` (one per server step) and `initial_weights` (the
    phase's W₀, from which a client's initial state is made when it is first sampled) belong to the phase in
    progress; `outputs` holds what finished phases produced (e.g. their trained weights), by phase name.
    `generation` counts the checkpoints that wrote client-state files (their names carry it).
    """

    round: int
    global_weights: Weights
    server_state: State
    client_states: ClientStates
    history: list[dict[str, Any]] = field(default_factory=list)
    timings: list[dict[str, Any]] = field(default_factory=list)
    config_yaml: str = ""
    phase: int = 0
    step_states: list[State] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    initial_weights: Weights = field(default_factory=dict)
    generation: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.client_states, ClientStates):  # a plain mapping: every state given
            self.client_states = ClientStates(values=self.client_states)

    @classmethod
    def empty(cls, phase: int = 0) -> FederationState:
        return cls(round=0, global_weights={}, server_state={}, client_states=ClientStates(), phase=phase)

    def enter_phase(self, phase: int) -> None:
        """Start phase `phase` afresh (its own weights and states); history and outputs carry over."""
        self.phase = phase
        self.restart_phase()

    def restart_phase(self) -> None:
        """The phase in progress starts its rounds afresh (a nested phase: FKPL's next expert)."""
        self.round, self.global_weights, self.server_state, self.step_states = 0, {}, {}, []
        self.client_states, self.initial_weights = ClientStates(), {}


def save_checkpoint(state: FederationState, path: Path) -> None:
    """Write atomically (temp file + rename), so a kill mid-write leaves the previous checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    root, generation = path.parent / CLIENTS_DIR, state.generation + 1
    files = state.client_states.write_changed(root, generation)
    payload = {
        "format": FORMAT_VERSION,
        "round": state.round,
        "global_weights": state.global_weights,
        "server_state": state.server_state,
        "client_ids": state.client_states.ids,
        "client_files": {str(k): name for k, name in files.items()},
        "initial_weights": state.initial_weights,
        "generation": generation,
        "history": state.history,
        "timings": state.timings,
        "config_yaml": state.config_yaml,
        "phase": state.phase,
        "step_states": state.step_states,
        "outputs": state.outputs,
    }
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    state.client_states.committed(root, files)
    state.generation = generation


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint file, or a run folder holding checkpoints/last.pt."""
    path = Path(path)
    candidate = path / "checkpoints" / CHECKPOINT_NAME if path.is_dir() else path
    if not candidate.is_file():
        raise CheckpointError(f"--resume {path}: no checkpoint found (looked for {candidate})")
    return candidate


def run_dir_of(checkpoint: Path) -> Path:
    """The run folder a checkpoint file belongs to."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent


def _read(path: Path, mmap: bool = False) -> tuple[Path, dict[str, Any]]:
    """The checkpoint file and its payload (memory-mapped: tensors are read only when touched)."""
    path = resolve_checkpoint(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from err
    if not isinstance(payload, dict) or payload.get("format") not in READABLE_FORMATS:
        raise CheckpointError(f"{path} is not an flsuite checkpoint of format {' or '.join(map(str, READABLE_FORMATS))}")
    return path, payload


def saved_config(path: Path) -> str:
    """The resolved config a checkpoint was written with, read without loading its tensors."""
    return _read(path, mmap=True)[1].get("config_yaml", "")


def load_checkpoint(path: Path) -> FederationState:
    path, payload = _read(path)
    return FederationState(
        round=int(payload["round"]),
        global_weights=payload["global_weights"],
        server_state=payload["server_state"],
        client_states=ClientStates(
            [int(k) for k in payload.get("client_ids", [])],
            values={int(k): v for k, v in payload.get("client_states", {}).items()},  # formats 1 and 2
            files={int(k): name for k, name in payload.get("client_files", {}).items()},
            root=path.parent / CLIENTS_DIR,
        ),
        history=list(payload["history"]),
        timings=list(payload["timings"]),
        config_yaml=payload.get("config_yaml", ""),
        phase=int(payload.get("phase", 0)),
        step_states=list(payload.get("step_states", [])),
        outputs=dict(payload.get("outputs", {})),
        initial_weights=payload.get("initial_weights", {}),
        generation=int(payload.get("generation", 0)),
    )
