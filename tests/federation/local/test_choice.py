"""`local.loop: auto` (flsuite.federation.local.choice): the loop a run takes, why, and that a resumed run keeps it."""

from __future__ import annotations

import json

import pytest
import torch

from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.local import choice
from flsuite.federation.local.choice import COMPILE_PAYS_FROM_STEPS, choose_loop, outside_a_run, steps_per_fit
from flsuite.federation.task import LocalTraining
from flsuite.methods.scaffold import Scaffold
from tests.helpers import head_federation

FEATURES = (1280,)


def chosen(
    local: LocalTraining | None = None,
    input_shape=FEATURES,
    step_hooks=False,
    sizes=(1200, 1200, 1200),
    per_round=3,
    rounds=10,
    processes=1,
    compiled_pays=True,
):
    return choose_loop(
        local or LocalTraining(epochs=10),
        input_shape,
        step_hooks,
        list(sizes),
        per_round,
        rounds,
        processes,
        compiled_pays=compiled_pays,
    )


def test_steps_per_fit_counts_the_batches_the_loop_iterates():
    assert steps_per_fit(LocalTraining(epochs=3, batch_size=16), 40) == 9  # 16 + 16 + 8 per epoch
    assert steps_per_fit(LocalTraining(epochs=3, batch_size=16, drop_last=True), 40) == 6
    assert steps_per_fit(LocalTraining(steps=7, batch_size=16), 40) == 7


def test_a_head_on_features_compiles_once_the_run_has_the_steps_to_pay_for_it():
    """3 clients of 1,200 samples, 10 epochs at batch 16: 750 steps a fit, 2,250 a round."""
    per_round = 3 * 750
    short = chosen(rounds=COMPILE_PAYS_FROM_STEPS // per_round)  # 22 rounds: 49,500 steps
    assert short.loop == "lean" and "~49,500 local steps per process, fewer than the 50,000" in short.reason
    long = chosen(rounds=COMPILE_PAYS_FROM_STEPS // per_round + 1)
    assert long.loop == "compiled" and "~51,750 local steps per process" in long.reason
    assert chosen(rounds=23, processes=2).loop == "lean"  # each of two workers compiles for half the steps
    assert long.requested == "auto" and long.log_line().startswith(
        "local.loop auto -> compiled: a head on feature vectors"
    )


@pytest.mark.parametrize(
    ("kwargs", "loop", "reason"),
    [
        ({"input_shape": (3, 32, 32)}, "lean", "inputs of shape (3, 32, 32) are images"),
        ({"local": LocalTraining(epochs=10, optimizer="adam")}, "lean", "local.optimizer adam"),
        ({"step_hooks": True}, "lean", "step hooks"),
        ({"compiled_pays": False}, "lean", "trains faster on the lean loop"),
        ({"compiled_pays": False, "local": LocalTraining(epochs=10, loop="compiled")}, "compiled", "set in the config"),
        ({"local": LocalTraining(epochs=10, precision="bf16-mixed")}, "standard", "local.precision bf16-mixed"),
        ({"local": LocalTraining(epochs=10, loop="lean")}, "lean", "set in the config"),
        ({"local": LocalTraining(epochs=10, loop="compiled"), "rounds": 1}, "compiled", "set in the config"),
    ],
)
def test_what_the_compiled_path_cannot_speed_up_stays_on_the_lean_loop(kwargs, loop, reason):
    got = chosen(**{"rounds": 100, **kwargs})
    assert got.loop == loop and reason in got.reason


def test_a_fit_outside_a_run_takes_the_lean_loop_or_standard_for_mixed_precision():
    assert outside_a_run(LocalTraining()).loop == "lean"
    assert outside_a_run(LocalTraining(precision="16-mixed")).loop == "standard"
    assert outside_a_run(LocalTraining(loop="compiled")).loop == "compiled"


def environment(run_dir) -> dict:
    """The loop choice the run's latest start recorded: the last resume's, else the run's own."""
    record = json.loads((run_dir / "environment.json").read_text())
    return (record.get("resumes") or [record])[-1]["local_loop"]


@pytest.mark.slow
def test_the_run_records_its_choice_and_trains_with_the_compiled_loop(tmp_path, monkeypatch):
    """The run of tests/federation/local/test_compiled.py's compiled tests (2 clients x 3 epochs of 6 batches a round),
    so that its graphs' kernels are those that module compiles."""
    from tests.federation.local.test_compiled import federation

    monkeypatch.setattr(choice, "COMPILE_PAYS_FROM_STEPS", 10)
    federation(tmp_path / "auto", "auto", rounds=2).fit()
    recorded = environment(tmp_path / "auto")
    assert (recorded["loop"], recorded["requested"]) == (
        "compiled",
        "auto",
    ) and "~72 local steps per process (>= 10)" in recorded["reason"]
    federation(tmp_path / "compiled", "compiled", rounds=2).fit()
    auto, compiled = (load_checkpoint(tmp_path / name).global_weights for name in ("auto", "compiled"))
    assert all(torch.equal(auto[k], compiled[k]) for k in auto)  # the same loop: the same bits


def test_a_resumed_run_keeps_the_loop_it_began_with(tmp_path, monkeypatch):
    """Chosen once: a resumed run does not switch loops when what the choice reads has changed (here the threshold;
    in practice e.g. the number of Ray workers), so it continues the same training."""
    head_federation(tmp_path, rounds=2, method=Scaffold()).fit()
    assert environment(tmp_path)["loop"] == "lean"
    monkeypatch.setattr(choice, "COMPILE_PAYS_FROM_STEPS", 1)
    head_federation(None, rounds=3, method=Scaffold()).fit(resume=tmp_path)
    assert environment(tmp_path)["loop"] == "lean"
    assert load_checkpoint(tmp_path).local_loop.loop == "lean"


@pytest.mark.parametrize(
    ("config_yaml", "began"),
    [("local:\n  loop: standard\n", "standard"), ("seed: 7\n", "lean")],
    ids=["named", "default"],
)
def test_a_run_begun_before_auto_resumes_on_the_loop_its_config_named(tmp_path, config_yaml, began):
    """A checkpoint with no recorded choice (written before `auto`): the resumed run trains with the loop its own
    config named, or lean (the default then) where it named none."""
    head_federation(tmp_path, rounds=2, local=LocalTraining(epochs=2, batch_size=16, lr=0.05, loop=began)).fit(
        config_yaml=config_yaml
    )
    (last,) = tmp_path.rglob("last.pt")
    payload = torch.load(last, weights_only=False)
    payload["local_loop"] = None
    torch.save(payload, last)
    head_federation(None, rounds=3).fit(resume=tmp_path)
    assert environment(tmp_path)["loop"] == began and "began with" in environment(tmp_path)["reason"]
