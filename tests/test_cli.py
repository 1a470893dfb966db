"""`flsuite fit`: config errors, --print_config round trip, and resume after a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flsuite.federation.checkpoint import load_checkpoint
from tests.helpers import PACE, SMALL_CONFIG, run_cli, write_config

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"

SMALL = SMALL_CONFIG


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"lokal": {"epochs": 2}}, "lokal"),
        ({"rounds": "many"}, 'key "rounds"'),
        ({"local": {"batch_size": 0}}, "local.batch_size must be >= 1"),
        (
            {
                "data": {
                    "class_path": "flsuite.data.builtin.UCIDigitsDomains",
                    "init_args": {"clients_per_domain": "two"},
                }
            },
            "clients_per_domain",
        ),
        (
            {
                "data": {
                    "class_path": "flsuite.data.builtin.UCIDigitsDomains",
                    "init_args": {"domains": ["clean", "blurry"]},
                }
            },
            "blurry",
        ),
        (
            {"method": {"class_path": "flsuite.methods.fedavg.FedAvg", "init_args": {"weighting": "bysize"}}},
            "weighting",
        ),
    ],
)
def test_bad_config_gives_a_named_one_paragraph_error(tmp_path, capsys, change, expected):
    cfg = write_config(tmp_path / "bad.yaml", {**SMALL, **change, "output_dir": str(tmp_path)})
    code, _, err = run_cli(["fit", "--config", str(cfg)], capsys)
    assert code == 2
    assert expected in err
    assert err.startswith("flsuite: error:") and "Traceback" not in err
    assert err.strip().count("\n") == 0  # one paragraph


@pytest.mark.parametrize(
    ("args", "overlay", "expected"),
    [
        (
            ["--method", "FedProxx"],
            None,
            [
                "method: unknown class 'FedProxx' (did you mean FedProx?)",
                "FedAvg, ",
                "Scaffold",
                "(on the command line)",
            ],
        ),
        (
            ["--model", "Foo"],
            None,
            [
                "model: unknown class 'Foo'; the known classes for model: ",
                "Linear",
                "SmallCNN",
                "(on the command line)",
            ],
        ),
        (
            ["--executor", "Bar"],
            None,
            [
                "executor: unknown class 'Bar'; the known classes for executor: ",
                "RayExecutor",
                "SerialExecutor",
                "(on the",
            ],
        ),
        (
            [],
            {"method": {"class_path": "flsuite.methods.fedprox.FedProxx"}},
            ["method: unknown class 'flsuite.methods.fedprox.FedProxx' (did you mean FedProx?)"],
        ),
        ([], {"model": {"class_path": "SmallCN"}}, ["model: unknown class 'SmallCN' (did you mean SmallCNN?)"]),
        (
            [],
            {
                "data": {
                    "class_path": "flsuite.data.benchmarks.Benchmark",
                    "init_args": {"suite": "pacs", "partition": {"class_path": "DomainSkeww"}},
                }
            },
            [
                "data.init_args.partition: unknown class 'DomainSkeww' (did you mean DomainSkew?)",
                "Dirichlet, DomainSkew, IID",
            ],
        ),
    ],
)
def test_unknown_class_name_lists_the_known_ones_and_the_nearest(tmp_path, capsys, args, overlay, expected):
    """One line naming the key, the nearest known class and every known class, and where it was set; not
    jsonargparse's union dump. Nothing is built or written."""
    base = write_config(tmp_path / "base.yaml", {**SMALL, "output_dir": str(tmp_path / "runs")})
    files = ["--config", str(base)]
    if overlay is not None:
        files += ["--config", str(write_config(tmp_path / "overlay.yaml", overlay))]
        expected = [*expected, f"(in {tmp_path / 'overlay.yaml'})"]
    code, out, err = run_cli(["fit", *files, *args], capsys)
    assert code == 2 and err.count("\n") == 1 and out == ""
    for text in expected:
        assert text in err
    assert "Union" not in err and "LazyInstance" not in err and str(base) not in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("overlay", "args", "expected"),
    [
        ({"rounds": "ten"}, [], "Parser key \"rounds\": Expected a <class 'int'>. Got value: ten (in OVERLAY)"),
        (
            {"local": {"lr": "fast"}},
            [],
            "Parser key \"local.lr\": Expected a <class 'float'>. Got value: fast (in OVERLAY)",
        ),
        ({"rounds": 4}, ["--rounds", "ten"], "Got value: ten (on the command line)"),
        ({"rounds": "ten"}, ["--seed", "1"], "Got value: ten (in OVERLAY)"),
    ],
)
def test_a_wrong_type_names_the_config_file_or_flag_that_set_it(tmp_path, capsys, overlay, args, expected):
    """The value that took effect is blamed: the base also sets `rounds` and `local.lr` (valid), the overlay after it
    overrides them; a flag after both wins."""
    base = write_config(tmp_path / "base.yaml", {**SMALL, "rounds": 2, "output_dir": str(tmp_path / "runs")})
    extra = write_config(tmp_path / "overlay.yaml", overlay)
    code, _, err = run_cli(["fit", "--config", str(base), "--config", str(extra), *args], capsys)
    assert code == 2 and err.count("\n") == 1
    assert expected.replace("OVERLAY", str(extra)) in err and str(base) not in err
    assert not (tmp_path / "runs").exists()


def test_missing_config_file_is_named(tmp_path, capsys):
    code, _, err = run_cli(["fit", "--config", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and "nope.yaml" in err


def test_print_config_round_trips_and_runs_the_same(tmp_path, capsys):
    cfg = write_config(tmp_path / "run.yaml", {**SMALL, "output_dir": str(tmp_path)})
    code, printed, _ = run_cli(["fit", "--config", str(cfg), "--print_config"], capsys)
    assert code == 0
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(printed)
    code, printed_again, _ = run_cli(["fit", "--config", str(resolved), "--print_config"], capsys)
    assert code == 0 and printed_again == printed
    assert yaml.safe_load(printed)["local"]["weight_decay"] == 1e-5  # defaults are spelled out

    assert run_cli(["fit", "--config", str(cfg), "--run_dir", str(tmp_path / "a")], capsys)[0] == 0
    assert run_cli(["fit", "--config", str(resolved), "--run_dir", str(tmp_path / "b")], capsys)[0] == 0
    assert (tmp_path / "a" / "metrics.jsonl").read_text() == (tmp_path / "b" / "metrics.jsonl").read_text()
    saved = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    assert saved["seed"] == 5 and "resume" not in saved and "config" not in saved


def test_quickstart_config_parses():
    from flsuite.cli import build_federation
    from flsuite.cli_parsers import fit_parser

    parser = fit_parser()
    fed = build_federation(parser, parser.parse_args(["--config", str(QUICKSTART)]))
    assert fed.rounds >= 10 and len(fed.data.build(fed.seed).clients) == 8


@pytest.mark.slow
def test_resume_after_sigkill_equals_uninterrupted(tmp_path, capsys):
    """A real kill -9 of `flsuite fit` mid-run, then `--resume <run folder>`: the same metrics as a full run. Only the
    killed run needs a process of its own; the full run and the resume are `flsuite fit` in this process."""
    rounds = 12
    cfg = {
        **SMALL,
        "rounds": rounds,
        "data": {
            **SMALL["data"],
            "init_args": {"domains": ["clean", "rotated"], "clients_per_domain": 3, "flatten": True},
        },
        "method": {"class_path": "tests.helpers.PacedFedAvg"},
        "sampling": {"fraction": 0.5},
        "local": {"epochs": 1, "batch_size": 32, "lr": 0.05},
    }
    config = write_config(tmp_path / "run.yaml", cfg)
    code, _, err = run_cli(["fit", "--config", str(config), "--run_dir", str(tmp_path / "full")], capsys)
    assert code == 0, err

    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT), PACE: "0.2"}  # 3 clients a round: 0.6 s or more per round
    cli = [sys.executable, "-m", "flsuite.cli", "fit", "--config", str(config), "--run_dir", str(killed)]
    proc = subprocess.Popen(cli, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = killed / "checkpoints" / "last.pt"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if ckpt.is_file() and load_checkpoint(killed).round >= 2:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = load_checkpoint(killed).round
    assert 2 <= done < rounds, f"the kill came too late to test anything (round {done})"

    code, _, err = run_cli(["fit", "--config", str(config), "--resume", str(killed)], capsys)
    assert code == 0, err
    assert (killed / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()


def test_features_command_builds_the_data_and_reports_it(tmp_path, capsys):
    import json

    cfg = write_config(tmp_path / "run.yaml", {**SMALL, "output_dir": str(tmp_path)})
    code, out, _ = run_cli(["features", "--config", str(cfg)], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["clients"] == 2 and report["input_shape"] == [64]
    assert report["train_samples"] + report["test_samples"] == 1797  # the UCI digits, split over the two domains


def is_overlay(path: Path) -> bool:
    """An overlay goes on top of a base config: `with_*.yaml`, `baselines/`, or a first comment line saying
    "overlay"."""
    first = path.read_text().lstrip().split("\n", 1)[0].lower()
    return (
        path.name.startswith("with_")
        or path.parent.name == "baselines"
        or (first.startswith("#") and "overlay" in first)
    )


CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if not is_overlay(p))  # overlays are tested with a base


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_every_shipped_config_parses_with_and_without_the_ggeur_overlay(path):
    from flsuite.cli_parsers import fit_parser

    parser = fit_parser()
    cfg = parser.parse_args(["--config", str(path)])
    assert cfg.rounds >= 1
    for overlay in (ROOT / "configs" / "ggeur").glob("with_*.yaml"):
        with_ggeur = parser.parse_args(["--config", str(path), "--config", str(overlay)])
        assert with_ggeur.setup[0].class_path == "flsuite.methods.ggeur.GGEUR"


def test_version_and_help_import_no_torch_or_lightning(tmp_path):
    """`flsuite --version`, `--help` and the tools' `--help` import neither torch nor Lightning; nor does `flsuite fit
    --help` once its text is cached, and the cached text is the parser's. The first one builds the full parser: torch,
    every configurable module, but not Lightning (`not_configurable`: a run on the CPU's lean loop never needs it)."""
    probe = (
        "import sys, flsuite.cli; code = flsuite.cli.main(sys.argv[1:]); "
        "print([m for m in ('torch', 'lightning') if m in sys.modules], code, file=sys.stderr)"
    )
    env = {**os.environ, "FLSUITE_USER_CACHE": str(tmp_path / "user-cache")}

    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", probe, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def result(proc: subprocess.Popen) -> tuple[str, str]:
        out, err = proc.communicate(timeout=600)
        return out, err.strip().splitlines()[-1]

    # side by side: none of these reads or writes the cache the first `fit --help` fills
    first, *light = [
        start(*args)
        for args in (["fit", "--help"], ["--version"], ["--help"], ["sweep", "--help"], ["compare", "--help"])
    ]
    for proc in light:
        assert result(proc)[1] == "[] 0", proc.args
    built, loaded = result(first)
    assert loaded == "['torch'] 0" and "--data DATA" in built and "flsuite.methods.scaffold.Scaffold" in built
    assert result(start("fit", "--help")) == (built, "[] 0")


def test_the_command_runs_main_then_freezes_the_heap_and_is_what_the_console_script_and_module_run(monkeypatch):
    """`flsuite.cli.command` (the `flsuite` script and `python -m flsuite.cli`) returns `main`'s status, also when
    `main` raises, with the heap frozen (`gc.freeze`: the interpreter's teardown then skips its final collections over
    torch's and Lightning's objects); `main` itself freezes nothing (a warm worker runs many commands)."""
    import gc
    import runpy
    import tomllib

    from flsuite import cli

    root = Path(__file__).resolve().parents[1]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["flsuite"] == "flsuite.cli:command"
    frozen_before = gc.get_freeze_count()
    assert cli.main(["--version"]) == 0 and gc.get_freeze_count() == frozen_before
    try:
        monkeypatch.setattr(cli, "main", lambda: 7)
        assert cli.command() == 7 and gc.get_freeze_count() > frozen_before
        gc.unfreeze()

        def fails():
            raise RuntimeError("boom")

        monkeypatch.setattr(cli, "main", fails)
        with pytest.raises(RuntimeError, match="boom"):
            cli.command()
        assert gc.get_freeze_count() > 0
        gc.unfreeze()
        monkeypatch.setattr(sys, "argv", ["flsuite", "--version"])
        monkeypatch.delitem(sys.modules, "flsuite.cli")  # run as `python -m flsuite.cli`: a fresh module
        with pytest.raises(SystemExit) as done:
            runpy.run_module("flsuite.cli", run_name="__main__")
        assert done.value.code == 0 and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_the_modules_the_parser_skips_define_only_lightning_classes():
    """What `import_all_modules` leaves out (`not_configurable`: the local loops' Trainer module and the generator fit)
    holds no class a config could name: each class defined there is a Lightning module or callback."""
    import importlib
    import inspect
    import pkgutil

    import lightning as L

    import flsuite
    from flsuite.cli_parsers import import_all_modules, not_configurable

    import_all_modules()
    skipped = [i.name for i in pkgutil.walk_packages(flsuite.__path__, "flsuite.") if not_configurable(i.name)]
    assert skipped == ["flsuite.federation.local.trainer", "flsuite.methods.generator_fit"]
    for name in skipped:
        module = importlib.import_module(name)
        defined = [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == name]
        assert defined, name
        for cls in defined:
            assert issubclass(cls, L.LightningModule | L.Callback), f"{name}.{cls.__name__}"
