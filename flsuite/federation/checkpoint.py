"""Round checkpoints: everything needed to continue a federation, stored as tensors and plain containers so they load
with `torch.load(weights_only=True)` (no arbitrary unpickling).

Randomness is derived from (seed, round, client, purpose), so no RNG state needs saving: the round number is enough.
Client states are not in the checkpoint file itself but one file per client beside it, written when they change
(`flsuite.federation.client_states`); what phases published and once-only query answers are one file each, written
once (`flsuite.federation.written_once`); the checkpoint names them. The state itself: `flsuite.federation.state`.
Format 5 writes published outputs and answers to their own files; formats 1–4 still load (`READABLE_FORMATS`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from flsuite.federation.client_states import ClientStates
from flsuite.federation.local.choice import LoopChoice
from flsuite.federation.state import FederationState, QueryAnswer, QueryTotals
from flsuite.federation.state_files import load

FORMAT_VERSION = 5
#: Formats this version reads (1: before protocols of phases, such a checkpoint is phase 0 of the default protocol;
#: 2: every client's state inside the checkpoint file; 3: the engine's bookkeeping inside `outputs`, see
#: `split_old_outputs`; 4: published outputs and answers inside the checkpoint file).
READABLE_FORMATS = (1, 2, 3, 4, 5)
CHECKPOINT_NAME = "last.pt"
#: The folder of the client-state files, beside the checkpoint.
CLIENTS_DIR = "clients"
#: The folder of the published outputs' and once-only answers' files, beside the checkpoint.
PARTS_DIR = "parts"


class CheckpointError(ValueError):
    """A checkpoint that cannot be found or does not fit this run."""


def save_checkpoint(state: FederationState, path: Path) -> None:
    """Write atomically (temp file + rename), so a kill mid-write leaves the previous checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    root, generation = path.parent / CLIENTS_DIR, state.generation + 1
    files = state.client_states.write_changed(root, generation)
    parts = path.parent / PARTS_DIR
    once = _written_once(state)
    part_files = state.written.write(parts, generation, once, _part_payload)
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
        "output_files": {name: part_files[_output_key(name)] for name in state.outputs},
        "queries": {name: totals.as_record() for name, totals in state.queries.items()},
        "query_weights": state.query_weights,
        "local_loop": state.local_loop.as_record() if state.local_loop is not None else None,
        "nested": state.nested,
        "answer_files": {
            owner: {key: part_files[_answer_key(owner, key)] for key in kept} for owner, kept in state.answers.items()
        },
    }
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    state.client_states.committed(root, files)
    state.written.committed(parts, once, part_files)
    state.generation = generation


def _output_key(name: str) -> str:
    return f"outputs/{name}"


def _answer_key(owner: str, key: str) -> str:
    return f"answers/{owner}/{key}"


def _written_once(state: FederationState) -> dict[str, object]:
    """The values of `state` that are written once each: published outputs and once-only answers, by file key."""
    values: dict[str, object] = {_output_key(name): value for name, value in state.outputs.items()}
    for owner, kept in state.answers.items():
        values.update({_answer_key(owner, key): answer for key, answer in kept.items()})
    return values


def _part_payload(value: object) -> Any:
    return value.as_record() if isinstance(value, QueryAnswer) else value


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
        raise CheckpointError(
            f"{path} is not an flsuite checkpoint of format {' or '.join(map(str, READABLE_FORMATS))}"
        )
    return path, payload


def saved_config(path: Path) -> str:
    """The resolved config a checkpoint was written with, read without loading its tensors."""
    return _read(path, mmap=True)[1].get("config_yaml", "")


def load_checkpoint(path: Path) -> FederationState:
    path, payload = _read(path)
    outputs, engine = dict(payload.get("outputs", {})), payload
    if payload["format"] < 4:
        outputs, engine = split_old_outputs(outputs)
    loop = engine.get("local_loop")
    state = FederationState(
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
        outputs=outputs,
        initial_weights=payload.get("initial_weights", {}),
        generation=int(payload.get("generation", 0)),
        queries={name: QueryTotals(**totals) for name, totals in engine.get("queries", {}).items()},
        query_weights={int(k): d for k, d in engine.get("query_weights", {}).items()},
        local_loop=LoopChoice(**loop) if loop is not None else None,
        nested=dict(engine.get("nested", {})),
        answers={
            owner: {key: QueryAnswer(**a) for key, a in kept.items()}
            for owner, kept in engine.get("answers", {}).items()
        },
    )
    if payload["format"] >= 5:
        _read_parts(state, path.parent / PARTS_DIR, payload)
    return state


def _read_parts(state: FederationState, parts: Path, payload: dict[str, Any]) -> None:
    """Format 5: the published outputs and once-only answers from their files, each remembered as written (a later
    checkpoint names the same file)."""
    for name, file in payload["output_files"].items():
        state.outputs[name] = load(parts, file)
        state.written.loaded(parts, _output_key(name), file, state.outputs[name])
    for owner, files in payload["answer_files"].items():
        for key, file in files.items():
            answer = state.answers.setdefault(owner, {})[key] = QueryAnswer(**load(parts, file))
            state.written.loaded(parts, _answer_key(owner, key), file, answer)


#: The keys of a once-only query's answer in formats 1–3 (kept in `outputs[owner][key]`).
_OLD_ANSWER_KEYS = frozenset({"value", "seconds", "bytes_up", "bytes_down"})


def split_old_outputs(outputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Formats 1–3 kept the engine's bookkeeping in `outputs` beside what phases published: `outputs["queries"]`,
    `["query_weights"]`, `["local_loop"]`, and per phase its nested-phase cursor (`outputs[phase]["current"]`) and
    its once-only answers (`outputs[owner][key]`, a dict of exactly the answer's keys). Returns (what phases
    published, the bookkeeping in format 4's layout); a phase's entry that held only bookkeeping is dropped."""
    published = dict(outputs)
    engine: dict[str, Any] = {k: published.pop(k) for k in ("queries", "query_weights", "local_loop") if k in published}
    nested, answers = engine.setdefault("nested", {}), engine.setdefault("answers", {})
    for name, value in list(published.items()):
        if not isinstance(value, dict):
            continue
        value = dict(value)
        if "current" in value:
            nested[name] = value.pop("current")
        kept = {
            k: value.pop(k) for k in list(value) if isinstance(value[k], dict) and set(value[k]) == _OLD_ANSWER_KEYS
        }
        if kept:
            answers[name] = kept
        if value:
            published[name] = value
        else:
            del published[name]
    return published, engine
