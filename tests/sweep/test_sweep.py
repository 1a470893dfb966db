"""sweeps/*.yaml are valid W&B sweeps whose keys are real flsuite options; `flsuite sweep` runs, prunes and resumes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from flsuite import sweep as sw

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))


def sample_values(spec: dict) -> list:
    """Every grid/categorical value, the constant, or both ends of a range."""
    if "values" in spec:
        return list(spec["values"])
    if "value" in spec:
        return [spec["value"]]
    return [spec["min"], spec["max"]]


def dotted(cfg: dict, key: str):
    """A dotted key of a resolved config; a list (setup stages) is entered at its last element, as jsonargparse does."""
    node = cfg
    for part in key.split("."):
        node = node[-1] if isinstance(node, list) else node
        node = node[part]
    return node


@pytest.fixture(scope="module")
def fit_parser():
    from flsuite.cli_parsers import fit_parser

    return fit_parser()


def test_there_are_sweeps_for_ggeur_and_the_baselines():
    names = {p.stem for p in SWEEPS}
    assert {
        "ggeur_eig_scale_T",
        "ggeur_bayes",
        "fedprox_mu",
        "moon",
        "feddyn_alpha",
        "fedopt",
        "scaffold_server_lr",
        "local_lr",
    } <= names


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_sweep_file_is_a_valid_wandb_sweep(path: Path):
    cfg = sw.load_sweep(path)  # structure: method, metric {name, goal}, parameters, command with ${args}, hyperband
    assert (ROOT / cfg["program"]).is_file() and cfg["project"] == "flsuite"
    command = [str(c) for c in cfg["command"]]
    assert command[:3] == ["${env}", "flsuite", "fit"] and command[-1] == "${args}"  # swept flags override the configs
    configs = [command[i + 1] for i, c in enumerate(command) if c == "--config"]
    assert configs and all((ROOT / c).is_file() for c in configs)
    if cfg.get("early_terminate"):  # W&B's hyperband reads the metric's history, so it must be logged every round
        assert sw.PER_ROUND.fullmatch(cfg["metric"]["name"])


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_wandbs_own_sweep_engine_accepts_the_file_and_its_grid_is_ours(path: Path):
    """W&B's open-source engine (`sweeps`, the server's schema and samplers) validates the file and proposes runs
    with exactly the swept keys; for a grid, its enumeration is the same set of points `flsuite sweep` visits.
    Its last release (0.2.0) predates W&B's `run_cap` key, which is therefore removed before validation."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 0.2.0 release's pydantic-v1 config names
        from sweeps.config import SweepConfig

        import sweeps
    raw = yaml.safe_load(path.read_text())
    config = SweepConfig({k: v for k, v in raw.items() if k != "run_cap"})  # raises on a schema violation
    swept = {k for k, spec in raw["parameters"].items() if "value" not in spec}
    first = sweeps.next_run(config, [])
    assert set(first.config) >= swept
    if raw["method"] == "grid":
        runs = []
        while (run := sweeps.next_run(config, runs)) is not None:
            run.state = sweeps.RunState.finished
            runs.append(run)
        wandb_points = {tuple(sorted((k, v["value"]) for k, v in r.config.items())) for r in runs}
        space = {k: s["values"] for k, s in raw["parameters"].items() if "values" in s}
        grid = sw.grid_sampler(space, seed=0)  # the sampler flsuite sweep uses; it orders the names itself
        ours = {tuple(sorted(zip(grid._search_space, point))) for point in grid._all_grids}
        assert len(runs) == sw.grid_size(raw) and wandb_points == ours


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_swept_key_resolves_to_a_real_option(path: Path, fit_parser):
    """The agent's command line (configs + `--key=value`) parses, applies each value, and names a logged metric."""
    cfg = sw.load_sweep(path)
    for name, spec in cfg["parameters"].items():
        for value in sample_values(spec):
            command = sw.expand_command(cfg, {name: value})
            args = sw.fit_args(command)
            assert args is not None and args[-1] == f"--{name}={value}"
            resolved = yaml.safe_load(fit_parser.dump(sw.check_fit_args(args, fit_parser), skip_unset=False))
            assert dotted(resolved, name) == value, f"{path.name}: --{name}={value} did not set {name}"
    resolved = yaml.safe_load(fit_parser.dump(sw.check_fit_args(sw.fit_args(sw.expand_command(cfg, {})), fit_parser)))
    metric = cfg["metric"]["name"]
    assert sw.PER_ROUND.fullmatch(metric) or metric.startswith(f"last{resolved['last_k']}/"), (
        f"{path.name}: {metric} is not logged"
    )


def test_args_expand_exactly_as_the_wandb_agent_does():
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    for path in SWEEPS:
        cfg = sw.load_sweep(path)
        params = {k: sample_values(s)[-1] for k, s in cfg["parameters"].items()}
        agent = create_sweep_command_args({"args": {k: {"value": v} for k, v in params.items()}})
        assert sw.args_flags(params) == agent["args"]
        assert sw.args_flags(params, hyphens=False) == agent["args_no_hyphens"]


def test_print_config_of_one_agent_command(capsys):
    from flsuite.cli import main

    cfg = sw.load_sweep(ROOT / "sweeps" / "ggeur_eig_scale_T.yaml")
    args = sw.fit_args(
        sw.expand_command(cfg, {"setup.init_args.eig_scale": "lambda", "setup.init_args.target_per_class": 250})
    )
    assert main(["fit", *args, "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (
        printed["setup"][0]["init_args"]["eig_scale"] == "lambda"
        and printed["setup"][0]["init_args"]["target_per_class"] == 250
    )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"method": "hyperopt"}, "method must be one of"),
        ({"metric": {"name": "acc_mean"}}, "metric must be"),
        ({"parameters": {"local.lr": {"values": [0.1, None]}}}, "null"),
        (
            {"parameters": {"local.lr": {"min": 0.1, "max": 1.0, "distribution": "normal"}}},
            "'local.lr': distribution 'normal'",
        ),
        ({"parameters": {"local.lr": {"min": 0.1, "max": 1.0}}}, "grid sweep needs `values`"),
        ({"command": ["flsuite", "fit"]}, "must contain ${args}"),
        ({"early_terminate": {"type": "hyperband", "eta": 3}}, "min_iter or max_iter"),
        ({"paramters": {}}, "unknown top-level key"),
    ],
)
def test_bad_sweep_files_are_rejected_naming_the_key(tmp_path: Path, change: dict, message: str):
    cfg = yaml.safe_load((ROOT / "sweeps" / "local_lr.yaml").read_text())
    cfg.update(change)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(sw.SweepError, match=message.replace("$", r"\$").replace("{", r"\{").replace("(", r"\(")):
        sw.load_sweep(path)


def test_mapping_to_optuna():
    cfg = sw.load_sweep(ROOT / "sweeps" / "moon.yaml")
    assert isinstance(sw.sampler_for(cfg, 0), optuna.samplers.RandomSampler)
    pruner = sw.pruner_for(cfg)
    assert (
        isinstance(pruner, optuna.pruners.HyperbandPruner)
        and pruner._min_resource == 5
        and pruner._reduction_factor == 3
    )
    assert isinstance(sw.sampler_for(sw.load_sweep(ROOT / "sweeps" / "fedopt.yaml"), 0), optuna.samplers.TPESampler)
    grid = sw.load_sweep(ROOT / "sweeps" / "ggeur_eig_scale_T.yaml")
    assert isinstance(sw.sampler_for(grid, 0), optuna.samplers.GridSampler) and sw.grid_size(grid) == 6
    assert isinstance(sw.pruner_for(grid), optuna.pruners.NopPruner)
    assert sw.per_round_key("last5/acc_mean") == "acc_mean" and sw.per_round_key("acc_std") == "acc_std"
    assert sw.objective_value({"last/acc_mean": 3.0}, "acc_mean", Path("s")) == 3.0


FAKE_FIT = """
import json, sys, time
ROUND_S = 0.15  # slow enough for the sweep's poll (0.05 s) to see a round before the next, even on a busy machine
from pathlib import Path
args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[2:] if "=" in a)
run = Path(args["run_dir"]); run.mkdir(parents=True)
x = float(args["x"])
with open(run / "metrics.jsonl", "a") as f:
    for r in range(1, 21):
        f.write(json.dumps({"round": r, "acc_mean": x * r}) + "\\n"); f.flush(); time.sleep(ROUND_S)
(run / "config.yaml").write_text("x: %s\\nrun_dir: %s\\n" % (x, run))
(run / "summary.json").write_text(json.dumps({"last5/acc_mean": x * 18}))
"""
#: The stand-in for the tests that prune nothing: 2 rounds, not paced.
SHORT_FIT = FAKE_FIT.replace("range(1, 21)", "range(1, 3)").replace("ROUND_S = 0.15", "ROUND_S = 0.0")


def test_trials_report_per_round_values_and_a_pruned_trial_is_stopped(tmp_path: Path, monkeypatch):
    """A fake `flsuite/cli.py fit` writing 20 rounds: values are reported per round; a pruned trial stops early."""
    (tmp_path / "flsuite").mkdir()
    (tmp_path / "flsuite" / "cli.py").write_text(FAKE_FIT)
    file = tmp_path / "fake.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "program": "flsuite/cli.py",
                "method": "grid",
                "metric": {"name": "last5/acc_mean", "goal": "maximize"},
                "parameters": {"x": {"values": [1.0, 0.1]}},
                "command": ["${env}", "${interpreter}", str(tmp_path / "flsuite" / "cli.py"), "fit", "${args}"],
            }
        )
    )
    monkeypatch.setattr(
        sw, "pruner_for", lambda cfg: optuna.pruners.ThresholdPruner(lower=1.0)
    )  # prunes x = 0.1 at once
    study = sw.Sweep(file, tmp_path / "out", workers=2, poll_s=0.05).run()
    by_x = {t.params["x"]: t for t in study.trials}
    good, pruned = by_x[1.0], by_x[0.1]
    assert good.state.name == "COMPLETE" and good.value == 18.0
    assert good.intermediate_values == {r: float(r) for r in range(1, 21)}
    assert pruned.state.name == "PRUNED" and len(pruned.intermediate_values) < 20
    assert not (Path(pruned.user_attrs["run_dir"]) / "summary.json").exists()  # its process was stopped
    best = yaml.safe_load((tmp_path / "out" / "best.yaml").read_text())
    assert best == {"x": 1.0, "run_dir": None}
    assert "| COMPLETE | 18 | 1 |" in (tmp_path / "out" / "trials.md").read_text()


@pytest.fixture
def no_plots(monkeypatch):
    """Sweeps that write their report without optuna's figures (seconds of matplotlib and fANOVA each time a sweep
    stops), for the tests of which trials run: the figures are drawn by the quickstart and the pruning tests, and
    checked by the quickstart's."""
    monkeypatch.setattr(sw.Sweep, "plots", lambda self, study: {})


def trials_in(db: Path, state: str) -> list[int]:
    """The numbers of the study's trials in `state` ("COMPLETE", "RUNNING", ...), read from its SQLite file."""
    if not db.is_file():
        return []
    try:
        with sqlite3.connect(db, timeout=1) as con:
            return [n for (n,) in con.execute("SELECT number FROM trials WHERE state = ?", (state,))]
    except sqlite3.OperationalError:  # tables not created yet, or locked
        return []


def completed(db: Path) -> list[int]:
    return trials_in(db, "COMPLETE")


def evidence(out: Path, log: Path) -> str:
    """What a failed assertion of the kill-and-resume test shows: the trials' states, the killed sweep's output and
    the tail of each trial's log (the verdict once depended on timing, and the message was all that was left)."""
    states = {state: trials_in(out / "study.db", state) for state in ("COMPLETE", "RUNNING", "FAIL", "WAITING")}
    parts = [f"trials by state: {states}", f"--- killed sweep ({log.name}):", log.read_text()[-3000:]]
    for trial_log in sorted((out / "logs").glob("*.log")):
        parts += [f"--- {trial_log.name}:", trial_log.read_text()[-1500:]]
    return "\n".join(parts)


@pytest.mark.slow
def test_sweep_on_the_quickstart_finishes_picks_the_best_and_resumes_after_a_kill(tmp_path: Path, fit_parser):
    """2 trials of sweeps/fedprox_mu.yaml (the agent's command, 1 round): kill once the first has finished and the
    second has begun (the sweep creates it right after; a kill before that interrupted nothing, and the retry went
    untested), rerun, check. Each trial is a `flsuite fit` process (seconds of imports): the resumed sweep's grid draws
    with re-queued and new trials side by side are tested on a stand-in program below
    (`test_a_trial_killed_before_or_after_sampling_is_rerun_at_the_same_grid_point`)."""
    out = tmp_path / "sweep"
    argv = [
        "sweeps/fedprox_mu.yaml",
        "--trials",
        "2",
        "--out",
        str(out),
        "--",
        "--rounds=1",
        "--local.epochs=1",
        "--wandb.enabled=false",
    ]
    argv += ["--data.init_args.clients_per_domain=1"]  # the quickstart's 4 domains, one client each
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    log = tmp_path / "killed_sweep.log"
    with open(log, "w") as sweep_output:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flsuite.cli", "sweep", *argv],
            cwd=ROOT,
            env=env,
            start_new_session=True,
            stdout=sweep_output,
            stderr=subprocess.STDOUT,
        )
    deadline = time.time() + 600
    while (
        not (completed(out / "study.db") and trials_in(out / "study.db", "RUNNING"))
        and time.time() < deadline
        and proc.poll() is None
    ):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its running trial
    proc.wait()
    first = completed(out / "study.db")
    assert len(first) == 1 and trials_in(out / "study.db", "RUNNING"), (
        f"the kill did not come between the trials\n{evidence(out, log)}"
    )
    stamps = {n: (out / "trials" / f"{n:04d}" / "metrics.jsonl").stat().st_mtime_ns for n in first}

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        status = sw.main([*argv[:5], "--workers", "2", *argv[5:]])  # the same sweep again: resumes
    finally:
        os.chdir(cwd)
    assert status == 0, f"the resumed sweep failed ({status})\n{evidence(out, log)}"
    study = optuna.load_study(study_name="fedprox-mu", storage=f"sqlite:///{out / 'study.db'}")
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 2, evidence(out, log)
    assert len({t.params["method.init_args.mu"] for t in done}) == 2, evidence(out, log)  # no grid point done twice
    for n in first:  # finished trials were not redone
        assert (out / "trials" / f"{n:04d}" / "metrics.jsonl").stat().st_mtime_ns == stamps[n]
    failed = [t for t in study.trials if t.state.name == "FAIL"]
    assert len(failed) == 1, evidence(out, log)
    (t,) = failed  # the trial the kill interrupted, retried with its parameters
    assert t.user_attrs.get("interrupted")
    retries = [r for r in done if r.user_attrs.get("retry_of") == t.number]
    assert len(retries) == 1 and t.params.items() <= retries[0].params.items()
    if "grid_id" in t.system_attrs:  # its grid point was drawn (its params may still be empty): it carries over
        assert retries[0].system_attrs["grid_id"] == t.system_attrs["grid_id"]
    # else the kill came between the trial's creation and its draw: the retry draws a free point (the distinct values
    # above show none was done twice or lost)
    best = max(done, key=lambda t: t.value)
    summary = json.loads((Path(best.user_attrs["run_dir"]) / "summary.json").read_text())
    assert study.best_trial.number == best.number and best.value == summary["last5/acc_mean"]
    rerun = fit_parser.parse_args(["--config", str(out / "best.yaml")])  # `flsuite fit --config best.yaml` reruns it
    assert (
        rerun.run_dir is None and rerun.method.init_args.mu == best.params["method.init_args.mu"] and rerun.rounds == 1
    )
    table = (out / "trials.md").read_text()
    assert f"Best: trial {best.number}" in table and table.count("| COMPLETE |") == 2
    assert (out / "trials.csv").read_text().count("COMPLETE") == 2
    assert (out / "plots" / "slice.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.usefixtures("no_plots")
def test_a_resumed_random_sweep_does_not_replay_its_samples(tmp_path: Path):
    (tmp_path / "flsuite").mkdir()
    (tmp_path / "flsuite" / "cli.py").write_text(SHORT_FIT)
    file = tmp_path / "random.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "method": "random",
                "metric": {"name": "last5/acc_mean", "goal": "maximize"},
                "parameters": {"x": {"min": 0.0, "max": 1.0}},
                "command": ["${env}", "${interpreter}", str(tmp_path / "flsuite" / "cli.py"), "fit", "${args}"],
            }
        )
    )
    sw.Sweep(file, tmp_path / "out", poll_s=0.02).run(2)
    study = sw.Sweep(file, tmp_path / "out", poll_s=0.02).run(4)  # resumed: two more
    xs = [t.params["x"] for t in study.trials]
    assert len(xs) == 4 and len(set(xs)) == 4


@pytest.mark.usefixtures("no_plots")
def test_a_resumed_grid_sweep_visits_each_point_once(tmp_path: Path):
    (tmp_path / "flsuite").mkdir()
    (tmp_path / "flsuite" / "cli.py").write_text(SHORT_FIT)
    file = tmp_path / "grid.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "method": "grid",
                "metric": {"name": "last5/acc_mean", "goal": "maximize"},
                "parameters": {"x": {"values": [0.1, 0.2, 0.3, 0.4, 0.5]}},
                "command": ["${env}", "${interpreter}", str(tmp_path / "flsuite" / "cli.py"), "fit", "${args}"],
            }
        )
    )
    for n in (1, 3, 5):  # three sessions, as after two kills
        study = sw.Sweep(file, tmp_path / "out", poll_s=0.02).run(n)
    assert sorted(t.params["x"] for t in study.trials) == [0.1, 0.2, 0.3, 0.4, 0.5]


@pytest.mark.parametrize("killed_at", ["after-sampling", "before-sampling", "before-its-grid-point"])
@pytest.mark.usefixtures("no_plots")
def test_a_trial_killed_before_or_after_sampling_is_rerun_at_the_same_grid_point(tmp_path: Path, killed_at: str):
    """A kill leaves a trial RUNNING: after its parameter was sampled, after its grid point was drawn but before any
    parameter, or right after optuna created it, before the sampler drew its point. The resumed sweep reruns the
    first two at their grid point; the third's retry draws a free point. Every value is done exactly once."""
    (tmp_path / "flsuite").mkdir()
    (tmp_path / "flsuite" / "cli.py").write_text(SHORT_FIT)
    file = tmp_path / "grid.yaml"
    values = [0.1, 0.2, 0.3, 0.4]
    file.write_text(
        yaml.safe_dump(
            {
                "method": "grid",
                "metric": {"name": "last5/acc_mean", "goal": "maximize"},
                "parameters": {"x": {"values": values}},
                "command": ["${env}", "${interpreter}", str(tmp_path / "flsuite" / "cli.py"), "fit", "${args}"],
            }
        )
    )
    first = sw.Sweep(file, tmp_path / "out", poll_s=0.02)
    first.run(1)
    study = first.study()
    if killed_at == "before-its-grid-point":
        number = study._storage.get_trial_number_from_id(study._storage.create_new_trial(study._study_id))
    else:
        killed = study.ask()  # left RUNNING, as by a kill (with its grid point assigned)
        number = killed.number
        if killed_at == "after-sampling":
            killed.suggest_categorical("x", values)
    study = sw.Sweep(file, tmp_path / "out", workers=2, poll_s=0.02).run(4)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert sorted(t.params["x"] for t in done) == values
    retry = next(t for t in done if t.user_attrs.get("retry_of") == number)
    if killed_at == "before-its-grid-point":
        assert "grid_id" not in study.trials[number].system_attrs
    else:
        assert retry.system_attrs["grid_id"] == study.trials[number].system_attrs["grid_id"]


def test_a_validation_metric_prunes_and_scores_on_validation_never_on_test():
    """Tuning on validation data (docs/results.md, "Tuning policy"): hyperband's per-round stand-in is
    `val/acc_mean`."""
    assert (
        sw.per_round_key("last5/val/acc_mean") == "val/acc_mean" and sw.per_round_key("val/acc_mean") == "val/acc_mean"
    )
    summary = {"last/acc_mean": 90.0, "last/val/acc_mean": 60.0, "last5/val/acc_mean": 61.0}
    assert sw.objective_value(summary, "val/acc_mean", Path("s")) == 60.0
    assert sw.objective_value(summary, "last5/val/acc_mean", Path("s")) == 61.0


@pytest.mark.usefixtures("no_plots")
def test_each_finished_trial_prints_one_progress_line(tmp_path: Path, capsys):
    """One stderr line per finished trial: done / target, its parameters and score (or why it has none), the best so
    far."""
    (tmp_path / "flsuite").mkdir()
    fails = "x = float(args['x'])\nif x == 0.2: sys.exit(3)\n"
    (tmp_path / "flsuite" / "cli.py").write_text(SHORT_FIT.replace('x = float(args["x"])\n', fails))
    file = tmp_path / "grid.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "method": "grid",
                "metric": {"name": "last5/acc_mean", "goal": "maximize"},
                "parameters": {"x": {"values": [0.1, 0.2, 0.3]}},
                "command": ["${env}", "${interpreter}", str(tmp_path / "flsuite" / "cli.py"), "fit", "${args}"],
            }
        )
    )
    capsys.readouterr()
    study = sw.Sweep(file, tmp_path / "out", poll_s=0.02).run()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    best = None
    for n, (line, t) in enumerate(zip(lines, sorted(study.trials, key=lambda t: t.datetime_complete)), start=1):
        x = t.params["x"]
        assert line.startswith(f"sweep grid [{n}/3] trial {t.number}: "), line
        assert f"| x={x} |" in line and line.endswith(" elapsed")
        if x == 0.2:
            assert f"fail; see {tmp_path / 'out' / 'logs' / f'{t.number:04d}.log'}" in line
        else:
            assert f"last5/acc_mean = {sw.fmt(x * 18)}" in line
            best = t if best is None or t.value > best.value else best
        assert (f"best {sw.fmt(best.value)} (trial {best.number})" if best else "best —") in line
