"""Checkpoints of every older format still load and resume exactly (flsuite/federation/checkpoint.py). Each older file
is made from a format-5 checkpoint of a killed run, rewritten into the older layout the way that version wrote it:

- 4: what phases published and once-only answers inside the file (`outputs`, `answers`), no `parts` folder;
- 3: the engine's bookkeeping inside `outputs` (`"queries"`, `"query_weights"`, `"local_loop"`, a phase's nested
  cursor `outputs[phase]["current"]`, a once-only answer `outputs[owner][key]`);
- 2: also every client's state inside the file, no W₀, no state files;
- 1: also no phases: no `phase`, `step_states` or `outputs` (phase 0 of the default protocol, no loop recorded).

The resumed run's metrics.jsonl equals the uninterrupted run's, and so do its query totals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from flsuite.federation.checkpoint import (
    CHECKPOINT_NAME,
    CLIENTS_DIR,
    PARTS_DIR,
    load_checkpoint,
    split_old_outputs,
)
from flsuite.federation.phases import Rounds
from flsuite.interrupts import RunInterrupted
from flsuite.methods.fkpl.prototypes import VirtualFeatureQuery
from flsuite.methods.scaffold import Scaffold
from tests.federation.test_run import CrashAtRound
from tests.helpers import head_federation
from tests.methods.test_fkpl import fkpl_federation

ENGINE_KEYS = ("queries", "query_weights", "local_loop", "nested", "answers")


def to_format_4(payload: dict, parts: Path) -> dict:
    def read(name: str):
        return torch.load(parts / name, weights_only=True)

    payload["outputs"] = {name: read(file) for name, file in payload.pop("output_files").items()}
    answers = payload.pop("answer_files")
    payload["answers"] = {owner: {key: read(file) for key, file in kept.items()} for owner, kept in answers.items()}
    return {**payload, "format": 4}


def to_format_3(payload: dict) -> dict:
    outputs = {k: dict(v) if isinstance(v, dict) else v for k, v in payload["outputs"].items()}
    engine = {k: payload.pop(k) for k in ENGINE_KEYS}
    for key in ("queries", "query_weights", "local_loop"):
        if engine[key]:
            outputs[key] = engine[key]
    for inside, name in engine["nested"].items():
        outputs.setdefault(inside, {})["current"] = name
    for owner, kept in engine["answers"].items():
        outputs.setdefault(owner, {}).update(kept)
    return {**payload, "format": 3, "outputs": outputs}


def to_format_2(payload: dict, clients: Path) -> dict:
    payload = to_format_3(payload)
    files = payload.pop("client_files")
    assert sorted(int(k) for k in files) == sorted(payload.pop("client_ids")), "format 2 holds every client's state"
    payload["client_states"] = {k: torch.load(clients / name, weights_only=True) for k, name in files.items()}
    for key in ("initial_weights", "generation"):
        payload.pop(key)
    return {**payload, "format": 2}


def to_format_1(payload: dict, clients: Path) -> dict:
    payload = to_format_2(payload, clients)
    assert payload.pop("phase") == 0 and not payload.pop("step_states"), "format 1 knows only the default protocol"
    assert set(payload.pop("outputs")) <= {"local_loop"}, "format 1 kept no outputs"
    return {**payload, "format": 1}


def downgrade(run_dir: Path, fmt: int) -> None:
    """Rewrite the run's format-5 checkpoint as format `fmt` wrote it."""
    path = run_dir / "checkpoints" / CHECKPOINT_NAME
    clients, parts = path.parent / CLIENTS_DIR, path.parent / PARTS_DIR
    payload = to_format_4(torch.load(path, weights_only=True), parts)
    old = {
        4: lambda p: p,
        3: lambda p: to_format_3(p),
        2: lambda p: to_format_2(p, clients),
        1: lambda p: to_format_1(p, clients),
    }[fmt](payload)
    torch.save(old, path)
    if parts.exists():  # a run that published nothing has none
        shutil.rmtree(parts)
    if fmt < 3:
        shutil.rmtree(clients)


# ---- the default protocol (SCAFFOLD: client states) -------------------------------------------------------------
SCAFFOLD = {"method": Scaffold(), "rounds": 4}


@pytest.fixture(scope="module")
def scaffold_full(tmp_path_factory):
    run = tmp_path_factory.mktemp("scaffold")
    head_federation(run, **SCAFFOLD).fit()
    return run


@pytest.mark.parametrize("fmt", [1, 2, 3, 4])
def test_a_default_protocol_checkpoint_of_each_older_format_resumes_exactly(tmp_path, scaffold_full, fmt):
    with pytest.raises(KeyboardInterrupt):
        head_federation(tmp_path, executor=CrashAtRound(3), **SCAFFOLD).fit()
    downgrade(tmp_path, fmt)
    loaded = load_checkpoint(tmp_path)
    assert loaded.round == 2 and loaded.outputs == {} and (loaded.local_loop is None) == (fmt == 1)
    head_federation(None, **SCAFFOLD).fit(resume=tmp_path)
    assert (tmp_path / "metrics.jsonl").read_text() == (scaffold_full / "metrics.jsonl").read_text()
    full, resumed = load_checkpoint(scaffold_full), load_checkpoint(tmp_path)
    for k in full.client_states:
        a, b = full.client_states[k]["c_i"], resumed.client_states[k]["c_i"]
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


# ---- FKPL: every kind of engine bookkeeping ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def fkpl_full(tmp_path_factory):
    run = tmp_path_factory.mktemp("fkpl")
    fkpl_federation(run).fit()
    return run


def kill_fkpl(run_dir: Path, where: str, monkeypatch) -> None:
    """Killed in expert 1's second round (a nested cursor, Stage 0's answer) or inside the virtual-feature exchange
    (Stage II's prototype answer, the weights each client holds from it)."""
    real_round, real_compute = Rounds._round, VirtualFeatureQuery.compute

    def _round(self, ctx, rnd, *a, **k):
        if where == "experts" and self.name == "experts/expert1" and rnd == 2:
            raise RunInterrupted()
        return real_round(self, ctx, rnd, *a, **k)

    def compute(self, client, task, model):
        if where == "virtual" and client.client_id == 3:
            raise RunInterrupted()
        return real_compute(self, client, task, model)

    with monkeypatch.context() as patch:
        patch.setattr(Rounds, "_round", _round)
        patch.setattr(VirtualFeatureQuery, "compute", compute)
        with pytest.raises(RunInterrupted):
            fkpl_federation(run_dir).fit()


@pytest.mark.parametrize(
    ("fmt", "where"),
    # format 4 differs from 5 only in where outputs and answers are kept: the kill that holds both kinds
    [(2, "experts"), (2, "virtual"), (3, "experts"), (3, "virtual"), (4, "virtual")],
)
def test_an_fkpl_checkpoint_of_each_older_format_resumes_exactly(tmp_path, monkeypatch, fkpl_full, fmt, where):
    kill_fkpl(tmp_path, where, monkeypatch)
    new = load_checkpoint(tmp_path)
    downgrade(tmp_path, fmt)
    old = load_checkpoint(tmp_path)
    assert (
        old.outputs.keys() == new.outputs.keys() and old.nested == new.nested and old.query_weights == new.query_weights
    )
    assert old.queries == new.queries and old.local_loop == new.local_loop
    assert {o: {k: (a.bytes_up, a.bytes_down) for k, a in kept.items()} for o, kept in old.answers.items()} == {
        o: {k: (a.bytes_up, a.bytes_down) for k, a in kept.items()} for o, kept in new.answers.items()
    }
    summary = fkpl_federation(None).fit(resume=tmp_path)
    assert (tmp_path / "metrics.jsonl").read_text() == (fkpl_full / "metrics.jsonl").read_text()
    full, resumed = load_checkpoint(fkpl_full), load_checkpoint(tmp_path)
    assert resumed.queries == full.queries and summary["query/fkpl/virtual/calls"] == 1
    assert all(
        torch.equal(resumed.outputs["calibrate"]["head"][k], full.outputs["calibrate"]["head"][k])
        for k in ("weight", "bias")
    )


def test_outputs_hold_only_what_the_phases_published(fkpl_full):
    """No engine key in `outputs`: one entry per phase that published (FKPL's three, its experts), the engine's
    bookkeeping in its own fields."""
    state = load_checkpoint(fkpl_full)
    experts = [f"experts/expert{v}" for v in range(3)]
    assert list(state.outputs) == ["cluster", *experts, "experts", "calibrate"]
    assert set(state.outputs["experts"]) == {"phases", "weights"} and set(state.outputs["calibrate"]) == {"head"}
    assert state.nested == {"experts": "experts/expert2"} and set(state.answers) == {"cluster", "calibrate"}
    assert set(state.queries) == {"fkpl/subspace", "fkpl/prototypes", "fkpl/virtual"} and state.local_loop is not None


def test_the_old_layout_splits_into_what_phases_published_and_the_engine_bookkeeping():
    answer = {"value": torch.ones(2), "seconds": 0.5, "bytes_up": 8, "bytes_down": 0}
    outputs = {
        "queries": {"q": {"calls": 1, "bytes_up": 8, "bytes_down": 0}},
        "query_weights": {0: "abc"},
        "local_loop": {"loop": "lean", "reason": "r", "requested": "auto"},
        "cluster": {"labels": [0, 1], "bases": answer},
        "experts": {"current": "experts/expert1", "weights": [{}]},
        "calibrate": {"current": "calibrate/head"},
        "train": {"weights": {"w": torch.zeros(1)}},
    }
    published, engine = split_old_outputs(outputs)
    assert published == {"cluster": {"labels": [0, 1]}, "experts": {"weights": [{}]}, "train": outputs["train"]}
    assert engine["nested"] == {"experts": "experts/expert1", "calibrate": "calibrate/head"}
    assert engine["answers"] == {"cluster": {"bases": answer}} and engine["query_weights"] == {0: "abc"}
    assert engine["queries"] == outputs["queries"] and engine["local_loop"] == outputs["local_loop"]
    assert "current" in outputs["experts"]  # the loaded payload is not changed


def named_parts(run_dir: Path) -> dict[str, str]:
    """What the run's checkpoint names: "outputs/<phase>" and "answers/<owner>/<key>" → file."""
    payload = torch.load(run_dir / "checkpoints" / CHECKPOINT_NAME, weights_only=True)
    named = {f"outputs/{name}": file for name, file in payload["output_files"].items()}
    for owner, kept in payload["answer_files"].items():
        named.update({f"answers/{owner}/{key}": file for key, file in kept.items()})
    return named


def test_published_outputs_and_answers_are_written_once_and_named_by_every_later_checkpoint(tmp_path, fkpl_full):
    """Format 5: each value a phase published and each once-only answer is written to its own file by the first
    checkpoint that holds it (its name carries that checkpoint's generation) and named by every later one, also after
    a resume; the folder holds exactly the files the last checkpoint names; a checkpoint saved elsewhere takes them."""
    from flsuite.federation.checkpoint import save_checkpoint

    with pytest.MonkeyPatch.context() as patch:
        kill_fkpl(tmp_path, "virtual", patch)  # Stage 0, the experts and the prototype answer written
    before = named_parts(tmp_path)
    fkpl_federation(None).fit(resume=tmp_path)
    after = named_parts(tmp_path)
    assert {k: after[k] for k in before} == before  # read back on resume, named again, not rewritten
    generation = {key: int(file.removesuffix(".pt").rsplit("-", 1)[1]) for key, file in after.items()}
    order = ["outputs/cluster", *(f"outputs/experts/expert{v}" for v in range(3)), "answers/calibrate/virtual"]
    assert [generation[k] for k in order] == sorted({generation[k] for k in order})  # each when it first appeared
    assert max(generation.values()) == load_checkpoint(tmp_path).generation == generation["outputs/calibrate"]
    parts = tmp_path / "checkpoints" / PARTS_DIR
    assert sorted(p.name for p in parts.iterdir()) == sorted(after.values())
    assert (tmp_path / "metrics.jsonl").read_text() == (fkpl_full / "metrics.jsonl").read_text()
    state, moved = load_checkpoint(tmp_path), tmp_path / "elsewhere" / CHECKPOINT_NAME
    save_checkpoint(state, moved)
    assert sorted(p.name for p in (moved.parent / PARTS_DIR).iterdir()) == sorted(after.values())
    again = load_checkpoint(moved)
    assert again.outputs.keys() == state.outputs.keys() and again.answers.keys() == state.answers.keys()
    assert torch.equal(again.outputs["calibrate"]["head"]["weight"], state.outputs["calibrate"]["head"]["weight"])
