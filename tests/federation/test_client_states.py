"""Client states in one file per client (flsuite/federation/client_states.py): written when they change, read when the
client is sampled, the checkpoint naming them; resume stays exact."""

from __future__ import annotations

import os
import re

import pytest
import torch

from flsuite.data.builtin import GaussianFeatures
from flsuite.federation import checkpoint
from flsuite.federation.checkpoint import load_checkpoint, save_checkpoint
from flsuite.federation.client_states import ClientStates
from flsuite.federation.sampling import ClientSampling
from flsuite.federation.state import FederationState
from flsuite.methods.scaffold import Scaffold
from tests.helpers import head_federation, killed_and_resumed

MANY = {
    "data": GaussianFeatures(
        dim=6, num_classes=3, num_domains=2, clients_per_domain=10, samples_per_client=20, test_per_domain=30
    ),
    "sampling": ClientSampling(per_round=3),
    "method": Scaffold(),
    "rounds": 4,
}


def state_files(run_dir) -> dict[int, int]:
    """client → the generation of its state file, from the names in checkpoints/clients/."""
    names = sorted(p.name for p in (run_dir / "checkpoints" / "clients").iterdir())
    assert all(re.fullmatch(r"\d+-\d+\.pt", n) for n in names), names
    return {int(n.split("-")[0]): int(n.split("-")[1].removesuffix(".pt")) for n in names}


def test_only_sampled_clients_have_state_files_each_its_latest_and_memory_holds_none(tmp_path):
    fed = head_federation(tmp_path, **MANY)
    fed.fit()
    ckpt = load_checkpoint(tmp_path)
    rounds = ckpt.history
    last_sampled = {k: r["round"] for r in rounds for k in r["clients"]}
    assert state_files(tmp_path) == last_sampled  # one file per client ever sampled; generation = its last round
    assert (
        len(ckpt.client_states.ids) == 20
        and sorted(ckpt.client_states) == sorted(last_sampled)
        and len(last_sampled) < 20
    )
    never = next(k for k in range(20) if k not in last_sampled)
    with pytest.raises(KeyError, match="never sampled"):  # made by the method when asked in a run, never written
        ckpt.client_states[never]
    sampled = next(iter(last_sampled))
    assert set(ckpt.client_states[sampled]["c_i"]) == {n for n, _ in fed.model.build((6,), 3).named_parameters()}
    assert ckpt.client_states.in_memory() == 0


def test_a_checkpoint_writes_only_the_states_that_changed(tmp_path, monkeypatch):
    written: list[str] = []
    save = torch.save

    def recording(obj, f, *args, **kwargs):
        written.append(os.path.basename(str(f)))
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", recording)
    head_federation(tmp_path, **MANY).fit()
    per_round = [[n for n in written[i : i + 4] if not n.startswith("last")] for i in range(0, len(written), 4)]
    assert (
        all(len(files) == 3 for files in per_round) and len(per_round) == 4
    )  # 3 sampled clients, then last.pt, per round


def test_resume_with_sampled_clients_is_exact(tmp_path):
    full, resumed = killed_and_resumed(tmp_path, crash_round=3, **MANY)
    assert list(full.client_states) == list(resumed.client_states)
    for k in full.client_states:
        a, b = full.client_states[k].get("c_i", {}), resumed.client_states[k].get("c_i", {})
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_a_kill_between_the_state_files_and_the_checkpoint_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    fed = head_federation(tmp_path, **{**MANY, "rounds": 2})
    fed.fit()
    before = load_checkpoint(tmp_path)
    files_before = state_files(tmp_path)
    real_replace = os.replace

    def killed_at_the_checkpoint(src, dst):
        if str(dst).endswith(checkpoint.CHECKPOINT_NAME):
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_at_the_checkpoint)
    before.round, before.client_states[0] = 99, {"c_i": {"x": torch.ones(2)}}
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(before, tmp_path / "checkpoints" / checkpoint.CHECKPOINT_NAME)
    monkeypatch.undo()
    after = load_checkpoint(tmp_path)
    assert after.round == 2 and {k: g for k, g in state_files(tmp_path).items() if k in files_before} == files_before
    assert "x" not in after.client_states.get(0, {}).get("c_i", {})


def test_an_earlier_checkpoint_with_every_state_inside_still_loads(tmp_path):
    path = tmp_path / "checkpoints" / checkpoint.CHECKPOINT_NAME
    path.parent.mkdir(parents=True)
    old = {
        "format": 2,
        "round": 1,
        "global_weights": {},
        "server_state": {},
        "client_states": {"0": {"c_i": {"w": torch.zeros(2)}}, "1": {"c_i": {}}},
        "history": [],
        "timings": [],
        "config_yaml": "",
        "phase": 0,
        "step_states": [],
        "outputs": {},
    }
    torch.save(old, path)
    state = load_checkpoint(path)
    assert list(state.client_states) == [0, 1] and torch.equal(state.client_states[0]["c_i"]["w"], torch.zeros(2))
    save_checkpoint(state, path)  # rewritten in the current format: the states move to their own files
    assert sorted(p.name for p in (path.parent / "clients").iterdir()) == ["0-1.pt", "1-1.pt"]
    assert torch.load(path, weights_only=True)["format"] == checkpoint.FORMAT_VERSION


def test_a_client_outside_the_phase_is_named():
    states = ClientStates([0, 1], initial=lambda k: {"k": k})
    assert states[1] == {"k": 1} and 1 not in states and list(states) == []
    states[1] = {"k": 10}
    assert list(states) == [1] and states[1] == {"k": 10}
    with pytest.raises(KeyError, match="client 5 is not a client of this phase"):
        states[5]
    assert isinstance(FederationState(0, {}, {}, {3: {}}).client_states, ClientStates)


def test_a_checkpoint_saved_somewhere_new_takes_the_state_files_with_it(tmp_path):
    head_federation(tmp_path / "a", **{**MANY, "rounds": 2}).fit()
    moved = tmp_path / "b" / "checkpoints" / checkpoint.CHECKPOINT_NAME
    save_checkpoint(load_checkpoint(tmp_path / "a"), moved)
    original, again = load_checkpoint(tmp_path / "a"), load_checkpoint(moved)
    assert sorted(again.client_states) == sorted(original.client_states)
    assert set(state_files(tmp_path / "b")) == set(state_files(tmp_path / "a"))
    for k in original.client_states:
        a, b = original.client_states[k]["c_i"], again.client_states[k]["c_i"]
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
