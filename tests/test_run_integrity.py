"""Run integrity (issue 11): one run per folder, Ctrl-C that reaches the suite, honest W&B exit status, resume that
refuses a different experiment, data roots that do not depend on the working directory; and everyday use (short
names, --version, errors that name the file)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from flsuite.federation.method import ClientModule
from flsuite.methods.fedavg import FedAvg
from flsuite.tracking import WandbConfig
from tests.helpers import PACE, SMALL_CONFIG, head_federation, run_cli, write_config

ROOT = Path(__file__).resolve().parents[1]

SMALL = {**SMALL_CONFIG, "name": "integrity"}


def cli_env(**extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        **extra,
    }
    for key in ("WANDB_SWEEP_ID", "WANDB_RUN_ID"):
        env.pop(key, None)
    return env


CLI = [sys.executable, "-m", "flsuite.cli", "fit"]
#: Seconds each client fit of an interrupted `flsuite fit` process waits at its start (tests.helpers.PacedFedAvg).
PACE_S = 0.3


def folder_digest(folder: Path) -> dict[str, str]:
    """Every file under a folder (except W&B's own) with its content hash."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "wandb" not in p.relative_to(folder).parts
    }


# ---- reading an offline W&B run ------------------------------------------------------------------------------
def wandb_records(path: Path):
    """The complete records of a `.wandb` transaction log (LevelDB log format: 7-byte header, 32 KiB blocks of chunks).

    A log read while W&B's service appends to it may end inside a chunk; the records before it are returned.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    block, pos, chunks = 32768, 7, []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        if pos + 7 + length > len(data):  # the tail W&B's service is still writing: read it on the next poll
            break
        chunks.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk
            record = pb.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


def wandb_exit_code(log: Path, timeout: float = 60) -> int:
    """The run's recorded exit code. W&B's service writes the log asynchronously (`finish` may return first): wait."""
    deadline = time.time() + timeout
    while True:
        codes = [r.exit.exit_code for r in wandb_records(log) if r.WhichOneof("record_type") == "exit"]
        if codes or time.time() > deadline:
            break
        time.sleep(0.2)
    assert codes, f"{log} has no exit record"
    return codes[-1]


def wandb_run_record(log: Path):
    return next(r.run for r in wandb_records(log) if r.WhichOneof("record_type") == "run")


# ---- 1. one run per folder -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_runs_started_at_the_same_moment_get_two_consistent_folders(tmp_path):
    cfg = write_config(
        tmp_path / "run.yaml",
        {**SMALL, "output_dir": str(tmp_path / "runs"), "wandb": {"enabled": True, "project": "t"}},
    )
    variants = {1: "0.05", 2: "0.1"}  # rounds -> lr: each folder must hold exactly one of them
    procs = [
        subprocess.Popen(
            [*CLI, "--config", str(cfg), f"--rounds={r}", f"--local.lr={lr}"],
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for r, lr in variants.items()
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-2000:]
    folders = sorted((tmp_path / "runs" / "integrity").iterdir())
    assert len(folders) == 2, f"two runs must get two folders, got {[f.name for f in folders]}"
    ids = set()
    for folder in folders:
        config = yaml.safe_load((folder / "config.yaml").read_text())
        rounds = [json.loads(line)["round"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert rounds == list(range(1, config["rounds"] + 1)), (
            f"{folder.name}: metrics do not belong to its config.yaml"
        )
        assert str(config["local"]["lr"]) == variants[config["rounds"]]
        logs = offline_runs(folder)
        assert len(logs) == 1, f"{folder.name}: expected one offline W&B run"
        ids.add(wandb_run_record(logs[0]).run_id)
    assert len(ids) == 2, "the two runs share a W&B run id"


def test_default_run_folders_are_unique_within_a_second(tmp_path):
    from flsuite.runfolder import new_run_dir

    made = {new_run_dir(tmp_path, "x", 0) for _ in range(50)}
    assert len(made) == 50 and all(p.is_dir() and p.name.split("-seed0-")[1] for p in made)


def test_run_dir_holding_a_run_is_refused_and_left_untouched(tmp_path, capsys):
    cfg = write_config(tmp_path / "run.yaml", SMALL)
    run_dir = tmp_path / "run"
    assert run_cli(["fit", "--config", str(cfg), "--run_dir", str(run_dir)], capsys)[0] == 0
    before = folder_digest(run_dir)
    code, _, err = run_cli(["fit", "--config", str(cfg), "--run_dir", str(run_dir), "--seed", "6"], capsys)
    assert code == 2
    assert str(run_dir) in err and "already holds a run" in err and "--resume" in err
    assert folder_digest(run_dir) == before


# ---- 2./3. Ctrl-C and W&B status -----------------------------------------------------------------------------
@pytest.mark.slow
def test_ctrl_c_checkpoints_exits_130_marks_wandb_interrupted_and_resumes_to_the_same_metrics(tmp_path, capsys):
    """A real SIGINT to a real `flsuite fit` mid-run (Lightning would turn a KeyboardInterrupt into exit 1). Only the
    interrupted run needs a process of its own; the resume and the full run are `flsuite fit` in this process."""
    rounds = 12
    # The interrupted process's clients wait PACE_S at the start of each fit, so a round lasts 2 x PACE_S or more and
    # the signal lands inside Lightning's Trainer.fit; the runs in this process do not wait.
    method = {"class_path": "tests.helpers.PacedFedAvg"}
    cfg = {
        **SMALL,
        "rounds": rounds,
        "method": method,
        "local": {"epochs": 1, "batch_size": 32, "lr": 0.02},
        "wandb": {"enabled": True, "project": "t"},
    }
    config = write_config(tmp_path / "run.yaml", cfg)
    run_dir = tmp_path / "interrupted"
    cli = [*CLI, "--config", str(config), "--run_dir", str(run_dir)]
    proc = subprocess.Popen(cli, env=cli_env(**{PACE: str(PACE_S)}), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 600
    while (
        time.time() < deadline
        and proc.poll() is None
        and not (metrics.is_file() and metrics.read_text().count("\n") >= 1)
    ):
        time.sleep(0.01)
    time.sleep(PACE_S / 2)  # into the next round's first client fit
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    err = err.decode()
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err and f"--resume {run_dir}" in err
    done = len(metrics.read_text().splitlines())
    assert 1 <= done < rounds, f"the interrupt came too late to test anything (round {done})"
    assert wandb_exit_code(offline_runs(run_dir)[0]) == 255  # W&B's convention for Ctrl-C: shown as not finished

    code, _, err = run_cli(
        ["fit", "--config", str(run_dir / "config.yaml"), "--resume", str(run_dir), "--wandb.enabled=false"], capsys
    )
    assert code == 0, err
    assert (
        run_cli(["fit", "--config", str(config), "--run_dir", str(tmp_path / "full"), "--wandb.enabled=false"], capsys)[
            0
        ]
        == 0
    )
    assert metrics.read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()


class NaNClient(ClientModule):
    """Every client update is NaN: the round has no usable client update."""

    def end(self, fit):
        with torch.no_grad():
            next(self.model.parameters()).fill_(float("nan"))


class NaNFedAvg(FedAvg):
    client_module = NaNClient


def offline_wandb(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    return WandbConfig(enabled=True, project="flsuite-tests")


def test_failed_run_is_recorded_as_failed_in_wandb(monkeypatch, tmp_path):
    from flsuite.federation.phases import ClientFailedError

    wandb_cfg = offline_wandb(monkeypatch, tmp_path)
    with pytest.raises(ClientFailedError, match="no usable client update"):
        head_federation(tmp_path / "run", rounds=2, method=NaNFedAvg(), wandb=wandb_cfg).fit(config_yaml="seed: 7\n")
    (log,) = offline_runs(tmp_path / "run")
    assert wandb_exit_code(log) == 1


def test_finished_run_is_labelled_for_the_dashboard(monkeypatch, tmp_path):
    wandb_cfg = offline_wandb(monkeypatch, tmp_path)
    head_federation(tmp_path / "run", rounds=2, name="exp-a", method=FedAvg(), wandb=wandb_cfg).fit(
        config_yaml="seed: 7\n"
    )
    (log,) = offline_runs(tmp_path / "run")
    assert wandb_exit_code(log) == 0
    run = wandb_run_record(log)
    assert run.job_type == "FedAvg" and run.run_group == "exp-a"
    assert {"FedAvg", "GaussianFeatures"} <= set(run.tags)
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["method_name"] == "FedAvg" and config["dataset"] == "GaussianFeatures"
    media = [p.name for p in (log.parent / "files" / "media").rglob("*")]
    assert any(name.startswith("convergence") for name in media), media
    assert any(name.startswith("final_per_domain") for name in media), media
    # the poll above reads the log while W&B's service appends to it: every prefix gives a prefix of the records
    records, data = [r.SerializeToString() for r in wandb_records(log)], log.read_bytes()
    for cut in range(7, len(data), 97):
        (tmp_path / "partial.wandb").write_bytes(data[:cut])
        partial = [r.SerializeToString() for r in wandb_records(tmp_path / "partial.wandb")]
        assert partial == records[: len(partial)], f"the log cut at byte {cut} does not read as a prefix"


def test_under_a_sweep_agent_the_agents_run_is_joined(monkeypatch, tmp_path):
    wandb_cfg = offline_wandb(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_SWEEP_ID", "sweep123")
    monkeypatch.setenv("WANDB_RUN_ID", "agentrun1")
    head_federation(tmp_path / "run", rounds=1, wandb=wandb_cfg).fit(config_yaml="seed: 7\n")
    (log,) = offline_runs(tmp_path / "run")
    assert wandb_exit_code(log) == 0
    assert wandb_run_record(log).run_id == "agentrun1"
    assert (tmp_path / "run" / "wandb_id.txt").read_text() == "agentrun1"


# ---- 4. resume with another experiment -----------------------------------------------------------------------
OLD = {
    "seed": 0,
    "rounds": 10,
    "run_dir": "runs/a",
    "progress": True,
    "data": {"class_path": "X", "init_args": {"beta": 0.5, "cache_dir": ".cache/features"}},
    "local": {"lr": 0.01},
    "wandb": {"project": "p", "tags": []},
    "executor": {"class_path": "SerialExecutor"},
    "setup": [],
    "checkpoint_every": 1,
}


@pytest.mark.parametrize(
    ("change", "blocking", "allowed"),
    [
        ({"seed": 1}, ["seed"], []),
        ({"rounds": 20}, [], ["rounds"]),
        ({"rounds": 5}, ["rounds"], []),
        (
            {"data": {"class_path": "X", "init_args": {"beta": 0.1, "cache_dir": ".cache/features"}}},
            ["data.init_args.beta"],
            [],
        ),
        (
            {"data": {"class_path": "X", "init_args": {"beta": 0.5, "cache_dir": "/scratch/f"}}},
            [],
            ["data.init_args.cache_dir"],
        ),
        ({"local": {"lr": 0.1}, "progress": False}, ["local.lr"], ["progress"]),
        (
            {"wandb": {"project": "q", "tags": ["x"]}, "run_dir": None, "checkpoint_every": 5},
            [],
            ["checkpoint_every", "run_dir", "wandb.project", "wandb.tags"],
        ),
        (
            {"executor": {"class_path": "RayExecutor", "init_args": {"num_cpus": 2}}},
            [],
            ["executor.class_path", "executor.init_args.num_cpus"],
        ),
        ({"setup": [{"class_path": "GGEUR"}]}, ["setup", "setup.0.class_path"], []),
        ({"model": {"class_path": "MLP"}}, ["model.class_path"], []),
    ],
)
def test_compare_configs_classifies_keys(change, blocking, allowed):
    from flsuite.runfolder import compare_configs

    diff = compare_configs(OLD, {**OLD, **change})
    assert diff.blocking == blocking and diff.allowed == allowed


def test_flatten_gives_dotted_keys():
    from flsuite.runfolder import flatten

    assert flatten({"a": {"b": 1, "c": [1, 2]}, "s": [{"k": 1}]}) == {"a.b": 1, "a.c": [1, 2], "s.0.k": 1}


def test_resume_with_another_seed_is_refused_before_anything_is_rewritten(tmp_path, capsys):
    cfg = write_config(tmp_path / "run.yaml", {**SMALL, "rounds": 2})
    run_dir = tmp_path / "run"
    assert run_cli(["fit", "--config", str(cfg), "--run_dir", str(run_dir)], capsys)[0] == 0
    before = folder_digest(run_dir)
    code, _, err = run_cli(
        ["fit", "--config", str(cfg), "--rounds", "4", "--seed", "6", "--local.lr", "0.2", "--resume", str(run_dir)],
        capsys,
    )
    assert code == 2, err
    assert "seed" in err and "local.lr" in err and "rounds" not in err.split("experiment")[1].split("Resume")[0]
    assert folder_digest(run_dir) == before


def test_resume_extending_rounds_continues_and_names_the_changed_keys(tmp_path, capsys, caplog):
    cfg = write_config(tmp_path / "run.yaml", {**SMALL, "rounds": 2})
    run_dir = tmp_path / "run"
    assert run_cli(["fit", "--config", str(cfg), "--run_dir", str(run_dir)], capsys)[0] == 0
    with caplog.at_level("WARNING", logger="flsuite.runfolder"):
        code, _, err = run_cli(
            ["fit", "--config", str(cfg), "--rounds", "3", "--progress", "true", "--resume", str(run_dir)], capsys
        )
    assert code == 0, err
    assert "progress" in caplog.text and "rounds" in caplog.text
    assert [json.loads(r)["round"] for r in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["rounds"] == 3  # the folder describes the run it holds


# ---- 5. data paths -------------------------------------------------------------------------------------------
def make_office_folder(root: Path, corrupt: bool = False) -> None:
    from flsuite.data.folder_names import OFFICE_CALTECH10_CLASSES

    rng = np.random.default_rng(0)
    from PIL import Image

    for domain in ("amazon", "caltech", "dslr", "webcam"):
        for cls in OFFICE_CALTECH10_CLASSES:
            d = root / domain / cls
            d.mkdir(parents=True)
            for i in range(4):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(d / f"{i}.png")
    if corrupt:
        (root / "dslr" / "mug" / "broken.png").write_bytes(b"not an image")


def office_config(**init_args) -> dict:
    data = {
        "class_path": "flsuite.data.benchmarks.Benchmark",
        "init_args": {"suite": "office_caltech10", "image_size": 8, **init_args},
    }
    return {**SMALL, "rounds": 1, "data": data, "model": {"class_path": "flsuite.models.heads.Linear"}}


@pytest.mark.parametrize("explicit_run_dir", [False, True])
def test_missing_data_folder_names_the_key_and_file_and_leaves_no_run_folder(
    tmp_path, capsys, monkeypatch, explicit_run_dir
):
    """A run that fails before its first round (here: building its data) leaves no run folder and no W&B run: the
    folder is created only once the data is built (`Federation._fit`)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = write_config(
        tmp_path / "run.yaml",
        {
            **office_config(root=str(tmp_path / "missing")),
            "output_dir": str(tmp_path / "runs"),
            "wandb": {"enabled": True},
        },
    )
    run_dir = ["--run_dir", str(tmp_path / "run")] if explicit_run_dir else []
    code, out, err = run_cli(["fit", "--config", str(cfg), *run_dir], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{tmp_path / 'missing'}" in err and f"(data.init_args.root set in {cfg})" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "run").exists()
    assert not any(p.name == "wandb" for p in tmp_path.rglob("*"))


def test_run_dir_holding_a_run_is_refused_before_the_data_is_built(tmp_path, capsys, monkeypatch):
    from flsuite.data.builtin import UCIDigitsDomains

    cfg = write_config(tmp_path / "run.yaml", {**SMALL, "rounds": 1})
    run_dir = tmp_path / "run"
    assert run_cli(["fit", "--config", str(cfg), "--run_dir", str(run_dir)], capsys)[0] == 0

    def build(self, seed):
        raise AssertionError("the data was built before the run_dir was refused")

    monkeypatch.setattr(UCIDigitsDomains, "build", build)
    code, _, err = run_cli(["fit", "--config", str(cfg), "--run_dir", str(run_dir)], capsys)
    assert code == 2 and "already holds a run" in err


def test_relative_data_root_resolves_against_flsuite_data_from_any_working_directory(tmp_path, capsys, monkeypatch):
    make_office_folder(tmp_path / "datasets" / "office")
    cfg = write_config(tmp_path / "run.yaml", office_config(root="office"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("FLSUITE_DATA", str(tmp_path / "datasets"))
    code, _, err = run_cli(["fit", "--config", str(cfg), "--run_dir", str(tmp_path / "run")], capsys)
    assert code == 0, err
    assert (
        yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]["init_args"]["root"] == "office"
    )  # as written


def test_relative_feature_cache_resolves_against_flsuite_cache(tmp_path, monkeypatch):
    from flsuite.data.benchmarks import Benchmark
    from tests.data.test_benchmarks import CountingEncoder

    make_office_folder(tmp_path / "datasets" / "office")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLSUITE_DATA", str(tmp_path / "datasets"))
    monkeypatch.setenv("FLSUITE_CACHE", str(tmp_path / "cache_base"))
    Benchmark(
        "office_caltech10", root=Path("office"), encoder=CountingEncoder(), cache_dir=Path("features"), image_size=8
    ).build(0)
    assert any((tmp_path / "cache_base" / "features").rglob("*")), "nothing was cached under $FLSUITE_CACHE/features"
    assert not (tmp_path / "features").exists()


def test_paths_resolve_against_their_bases(monkeypatch, tmp_path):
    from flsuite.paths import cache_path, data_path

    monkeypatch.delenv("FLSUITE_DATA", raising=False)
    monkeypatch.delenv("FLSUITE_CACHE", raising=False)
    assert data_path("data/pacs") == Path("data/pacs") and cache_path(".cache/features") == Path(".cache/features")
    monkeypatch.setenv("FLSUITE_DATA", str(tmp_path / "d"))
    monkeypatch.setenv("FLSUITE_CACHE", str(tmp_path / "c"))
    assert data_path("pacs") == tmp_path / "d" / "pacs" and cache_path("features") == tmp_path / "c" / "features"
    assert data_path("/abs/pacs") == Path("/abs/pacs") and cache_path("/abs/f") == Path("/abs/f")


# ---- everyday use --------------------------------------------------------------------------------------------
def test_short_class_names_on_the_command_line_and_in_yaml(tmp_path, capsys):
    cfg = write_config(tmp_path / "run.yaml", {**SMALL, "method": {"class_path": "FedProx"}})
    code, out, err = run_cli(
        ["fit", "--config", str(cfg), "--executor", "RayExecutor", "--model", "MLP", "--print_config"], capsys
    )
    assert code == 0, err
    resolved = yaml.safe_load(out)
    assert resolved["method"]["class_path"] == "flsuite.methods.fedprox.FedProx"
    assert resolved["executor"]["class_path"] == "flsuite.federation.ray_executor.RayExecutor"
    assert resolved["model"]["class_path"] == "flsuite.models.heads.MLP"


def test_help_lists_every_method_and_version_is_printed(capsys):
    code, out, _ = run_cli(["fit", "--help"], capsys)
    assert code == 0
    for name in (
        "FedProx",
        "Scaffold",
        "MOON",
        "FedDyn",
        "FedOpt",
        "FedProto",
        "FedNTD",
        "FedMix",
        "FedFA",
        "GGEUR",
        "RayExecutor",
        "SmallCNN",
        "Benchmark",
    ):
        assert name in out, name
    import flsuite

    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out.strip() == f"flsuite {flsuite.__version__}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rounds: [1,\n", "is not valid YAML (line 2"),
        ("", "is empty"),
        ("# nothing\n", "is empty"),
        ("- 1\n", "must hold a mapping"),
    ],
)
def test_malformed_or_empty_yaml_names_the_file(tmp_path, capsys, text, expected):
    bad = tmp_path / "broken.yaml"
    bad.write_text(text)
    code, _, err = run_cli(
        ["fit", "--config", str(write_config(tmp_path / "base.yaml", SMALL)), "--config", str(bad)], capsys
    )
    assert code == 2 and str(bad) in err and expected in err


@pytest.mark.parametrize(
    "overlay",
    [
        {"lokal": 1},
        {"local": {"epochz": 2}},
        {"method": {"class_path": "FedAvg", "init_args": {"weightin": "uniform"}}},
    ],
)
def test_unknown_key_names_the_config_file_that_holds_it(tmp_path, capsys, overlay):
    base = write_config(tmp_path / "base.yaml", SMALL)
    extra = write_config(tmp_path / "overlay.yaml", overlay)
    code, _, err = run_cli(["fit", "--config", str(base), "--config", str(extra)], capsys)
    assert code == 2 and f"(in {extra})" in err and str(base) not in err


def test_corrupt_image_error_names_the_file_and_skip_unreadable(tmp_path, capsys):
    make_office_folder(tmp_path / "office", corrupt=True)
    cfg = write_config(tmp_path / "run.yaml", office_config(root=str(tmp_path / "office")))
    code, _, err = run_cli(["fit", "--config", str(cfg), "--run_dir", str(tmp_path / "run")], capsys)
    assert code == 2 and "broken.png" in err and "skip_unreadable" in err


def test_sigint_handler_is_only_installed_while_fit_runs(tmp_path, capsys):
    """After the fit the caller's own SIGINT handler is back (compared with the handler in place before, not with
    Python's default: a process started in the background inherits SIG_IGN)."""

    def callers_handler(signum, frame):  # pragma: no cover - never signalled
        raise AssertionError("not expected to run")

    cfg = write_config(tmp_path / "run.yaml", {**SMALL, "rounds": 1})
    previous = signal.signal(signal.SIGINT, callers_handler)
    try:
        assert run_cli(["fit", "--config", str(cfg), "--run_dir", str(tmp_path / "run")], capsys)[0] == 0
        assert signal.getsignal(signal.SIGINT) is callers_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_options_added_after_a_run_started_do_not_block_its_resume_at_their_defaults():
    """A run started before `local.loop`/`protocol` existed has no such keys; resuming it with the defaults continues,
    a non-default value of a new option still changes the experiment."""
    from flsuite.cli import option_defaults
    from flsuite.runfolder import check_resume_config

    defaults = option_defaults()
    assert defaults["local.loop"] == "auto" and defaults["local.lr_milestones"] == []
    old = {"seed": 0, "local": {"lr": 0.01}}
    new = {
        "seed": 0,
        "local": {"lr": 0.01, "loop": "auto", "lr_milestones": [], "augment": {"hflip": False}},
        "protocol": None,
    }
    assert check_resume_config(yaml.safe_dump(old), yaml.safe_dump(new), "r", defaults=option_defaults).blocking == []
    # a run begun when the default was `lean` (its config says so) resumes under the new default `auto`, which
    # continues on the loop the run began with; an explicit other loop would change the experiment
    began_lean = {"seed": 0, "local": {"lr": 0.01, "loop": "lean"}}
    assert check_resume_config(
        yaml.safe_dump(began_lean), yaml.safe_dump(new), "r", defaults=option_defaults
    ).allowed == ["local.loop"]
    with pytest.raises(ValueError, match=r"local.loop: 'lean' -> 'compiled'"):
        check_resume_config(
            yaml.safe_dump(began_lean),
            yaml.safe_dump({**new, "local": {**new["local"], "loop": "compiled"}}),
            "r",
            defaults=option_defaults,
        )
    with pytest.raises(ValueError, match=r"local.loop: \(absent\) -> 'standard'"):
        check_resume_config(
            yaml.safe_dump(old),
            yaml.safe_dump({**new, "local": {**new["local"], "loop": "standard"}}),
            "r",
            defaults=option_defaults,
        )
