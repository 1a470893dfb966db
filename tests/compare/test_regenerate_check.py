"""experiments/regenerate_check.py (issue 38, item 5): a committed table's sampled rows rerun from its own command and
diffed cell by cell: a table its command regenerates passes, a changed cell is reported as committed vs fresh."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.helpers import load_experiment

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check():
    return load_experiment("regenerate_check")


def test_the_sample_keeps_the_rows_variants_and_writes_elsewhere(check, tmp_path: Path):
    command = (
        "python experiments/study.py --name s --base b.yaml --variant FedAvg= --variant '+ X=x.yaml' --seeds 0 1 "
        "--workers 2 --out docs/results/s.md --html s.html -- --rounds 3"
    )
    argv = check.sample_argv(command, ["+ X"], tmp_path / "runs", tmp_path / "o.md", None)
    assert argv == [
        "--name",
        "s",
        "--base",
        "b.yaml",
        "--variant",
        "+ X=x.yaml",
        "--seeds",
        "0",
        "1",
        "--workers",
        "2",
    ] + [
        "--runs",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "o.md"),
        "--",
        "--rounds",
        "3",
    ]
    grid = (
        "python experiments/study.py --name s --base b.yaml --variant 'P [mu 1]=--m=1' --variant 'P [mu 2]=--m=2' "
        "--variant Q= --select_on val"
    )
    kept = check.sample_argv(grid, ["P [mu 2]"], tmp_path, tmp_path / "o.md", 1)
    assert [kept[i + 1] for i, a in enumerate(kept) if a == "--variant"] == [
        "P [mu 1]=--m=1",
        "P [mu 2]=--m=2",
    ]  # the group
    with pytest.raises(SystemExit, match="not `python experiments/study.py ...` but 'bash experiments/x.sh'"):
        check.sample_argv("bash experiments/x.sh", ["A"], tmp_path, tmp_path / "o.md", None)
    with pytest.raises(SystemExit, match=r"row\(s\) \['Z'\] are not variants"):
        check.sample_argv(command, ["Z"], tmp_path, tmp_path / "o.md", None)


#: A quickstart-sized federation (the quickstart's digits domains and CNN, smaller), its thread count pinned as the
#: quickstart's (one intra-op thread: the same metrics.jsonl in any process).
TINY = {
    "name": "tiny",
    "seed": 0,
    "rounds": 2,
    "data": {
        "class_path": "flsuite.data.builtin.UCIDigitsDomains",
        "init_args": {"domains": ["clean", "inverted"], "clients_per_domain": 1, "beta": 0.5},
    },
    "model": {"class_path": "flsuite.models.heads.SmallCNN", "init_args": {"channels": [4, 8], "hidden": 16}},
    "local": {"epochs": 1, "batch_size": 32, "lr": 0.02},
    "threads": {"intra_op": 1},
}


def committed_table(tmp: Path) -> Path:
    """A two-variant study table (FedAvg and lr 0.05; 2 rounds, seed 0) as experiments/study.py writes it: the driver's
    own table and "Regenerate with:" command, its runs (the federation's part, not the check's) run in this process."""
    base = tmp / "tiny.yaml"
    base.write_text(yaml.safe_dump(TINY))
    table = tmp / "t.md"
    args = ["--name", "t", "--base", str(base), "--variant", "FedAvg=", "--variant", "lr 0.05=--local.lr=0.05"]
    args += ["--seeds", "0", "--workers", "2", "--runs", str(tmp / "runs"), "--out", str(table), "--", "--rounds", "2"]
    done, runs = study_here(args)
    assert done.returncode == 0 and runs == 2, done.stderr
    return table


def study_here(args: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """`python experiments/study.py *args` with its `flsuite` commands run in this process (the study's decisions and
    tables; its worker processes are tests/test_pool.py's), as `subprocess.run` returns it; and how many runs ran."""
    from tests.helpers import study_in_this_process

    study, out, err = load_experiment("study"), io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        pool = study_in_this_process(study, mp)
        mp.chdir(ROOT)
        mp.setattr(sys, "argv", ["study.py", *args])
        code = study.main()
    return subprocess.CompletedProcess(args, code or 0, out.getvalue(), err.getvalue()), pool.runs


def without_paths(cmd: list[str]) -> list[str]:
    """A study command with the values of --runs and --out (fresh folders, one per check) left out."""
    return [a for i, a in enumerate(cmd) if i == 0 or cmd[i - 1] not in ("--runs", "--out")]


@pytest.mark.slow
def test_a_table_regenerates_and_a_changed_cell_is_reported(check, tmp_path: Path, monkeypatch, capsys):
    """A two-variant study table over a quickstart-sized federation; the check reruns its FedAvg row from the table's
    command (`python experiments/study.py ...`, run in this process: `study_here`): every cell equal, wall time shown
    but not judged, only the sampled row run. With one cell of that row edited, the check exits 1 and prints the
    committed and the fresh value of that cell; that second check's study (the same command as the first's, the same
    code) is not run again but replayed from the first one's fresh table."""
    table = committed_table(tmp_path)
    committed = table.read_text()
    row = next(line for line in committed.splitlines() if line.startswith("| FedAvg |"))
    avg = row.split("|")[-5].strip()  # the AVG column: | method | 2 domains | AVG | STD | STD (n-1) | seeds |
    ran: list[list[str]] = []

    def run(cmd: list[str], **kwargs):  # the table's command, `python experiments/study.py ...`, run in this process
        ran.append(cmd)
        assert cmd[:2] == [sys.executable, str(ROOT / "experiments" / "study.py")] and kwargs["cwd"] == ROOT
        return study_here(cmd[2:])[0]

    monkeypatch.setattr(check, "subprocess", SimpleNamespace(run=run))
    assert check.main([str(table), "--rows", "FedAvg", "--runs", str(tmp_path / "fresh1")]) == 0
    out = capsys.readouterr().out
    assert f"| 1 | FedAvg | AVG | {avg} | {avg} | same |" in out and "DIFFERS" not in out
    assert (
        "| 3 | FedAvg | bytes up / run |" in out
        and "| 3 | FedAvg | s / round |" in out
        and "(wall time, not judged)" in out
    )
    assert "lr 0.05" not in out and not (tmp_path / "fresh1" / "t" / "lr-0-05").exists()  # only the sample ran
    assert len(ran) == 1 and (tmp_path / "fresh1" / "t" / "fedavg" / "seed0" / "summary.json").is_file()

    def replay(cmd: list[str], **kwargs):
        assert without_paths(cmd) == without_paths(ran[0])
        out = Path(cmd[cmd.index("--out") + 1])
        out.parent.mkdir(parents=True)
        shutil.copy(tmp_path / "fresh1" / "t.fresh.md", out)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(check, "subprocess", SimpleNamespace(run=replay))
    edited = row.replace(f"| {avg} |", "| 99.99 |", 1)
    table.write_text(committed.replace(row, edited))
    assert check.main([str(table), "--rows", "FedAvg", "--runs", str(tmp_path / "fresh2")]) == 1
    out = capsys.readouterr().out
    assert f"| 1 | FedAvg | AVG | 99.99 | {avg} | **DIFFERS** |" in out and "1 differ" in out


def test_a_table_that_gained_columns_is_checked_on_its_old_ones_by_name(check):
    """A committed cost table without the later "bytes ... / run" columns, and a fresh output with a paired table
    inserted before the cost table: the old table's cells are judged against the fresh cost table by column name
    (not "(missing)", as when only an identical header matched); a changed cell is still reported."""
    committed = check.tables(
        "| method | AVG | seeds |\n|---|---|---|\n| A | 90.00 | 3 |\n\n"
        "| method | bytes up / round | s / round |\n|---|---|---|\n| A | 6.0 MiB | 0.31 |\n"
    )
    fresh_text = (
        "| method | AVG | seeds |\n|---|---|---|\n| A | 90.00 | 3 |\n\n"
        "| method | Δ AVG vs B | SE |\n|---|---|---|\n| A | +0.10 | 0.05 |\n\n"
        "| method | bytes up / round | bytes up / run | s / round |\n|---|---|---|---|\n| A | {} | 301 MiB | 0.49 |\n"
    )
    cells = check.compare_tables(committed, check.tables(fresh_text.format("6.0 MiB")), ["A"])
    assert [(c.table, c.column, c.fresh) for c in cells] == [
        (0, "AVG", "90.00"),
        (0, "seeds", "3"),
        (1, "bytes up / round", "6.0 MiB"),
        (1, "s / round", "0.49"),
    ]
    assert all(c.same for c in cells if c.judged)
    changed = check.compare_tables(committed, check.tables(fresh_text.format("7.0 MiB")), ["A"])
    assert [(c.column, c.committed, c.fresh) for c in changed if c.judged and not c.same] == [
        ("bytes up / round", "6.0 MiB", "7.0 MiB")
    ]
    # where a name repeats (FedEGG's strength table: "guided" per setting), only place says which column is which:
    # a fresh table that merely holds those names is not taken for it
    repeated = check.tables("| method | guided | guided |\n|---|---|---|\n| A | 60 | 47 |\n")
    grown = check.tables("| method | guided | ratio | guided |\n|---|---|---|---|\n| A | 60 | 0.4 | 47 |\n")
    assert [c.fresh for c in check.compare_tables(repeated, grown, ["A"])] == [None, None]


STRENGTH = "OMP_NUM_THREADS=1 python experiments/fedegg_study.py --study strength --seeds 0 1 2 --out docs/results/s.md"


def test_a_fedegg_strength_sample_reruns_the_rows_and_seeds_asked_with_the_commands_environment(check, tmp_path):
    env, argv = check.split_env(STRENGTH)
    assert env == {"OMP_NUM_THREADS": "1"} and check.command_seeds(argv) == [0, 1, 2]
    sample = check.fedegg_sample_argv(argv, ["FedAvg", "FedDC"], [0], tmp_path / "runs", tmp_path / "o.md")
    assert sample == ["--study", "strength", "--methods", "FedAvg", "FedDC", "--seeds", "0"] + [
        "--runs",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "o.md"),
    ]
    with pytest.raises(SystemExit, match="only `experiments/fedegg_study.py --study strength` tables"):
        check.fedegg_sample_argv(
            check.split_env(STRENGTH.replace("strength", "tau"))[1], ["FedAvg"], [0], tmp_path, tmp_path
        )


def strength_table(seeds: list[int], methods: list[str], monkeypatch) -> str:
    """fedegg_study's own strength table over fixed per-run numbers (a run's accuracy, guided rounds and ratio are
    functions of its setting, method, variant and seed), as `--study strength` writes it."""
    fedegg = load_experiment("fedegg_study")
    monkeypatch.setattr(fedegg, "strength_run", lambda setting, name, variant, seed: (setting, name, variant, seed))
    value = lambda key: (hash(key) % 1000) / 37.0  # noqa: E731 - deterministic within the process
    monkeypatch.setattr(fedegg, "last_acc", lambda key: 60.0 + value(key))
    monkeypatch.setattr(fedegg, "guided_log", lambda key: (int(value(key)), value(key) / 30.0))
    return f"<!-- regenerate: {STRENGTH} -->\n{fedegg.strength(seeds, methods)}\n"


def test_a_fedegg_strength_table_is_checked_on_its_sampled_seeds_values(check, tmp_path, monkeypatch, capsys):
    """The committed strength table (seeds 0-2) against a fresh one of FedAvg's row on seed 0, both written by
    fedegg_study.strength: every per-seed cell's seed-0 value is judged and equal, means and intervals over every
    seed are shown, not judged; a seed-0 value edited is reported, a seed-1 value edited is not sampled."""
    table = tmp_path / "s.md"
    table.write_text(strength_table([0, 1, 2], ["FedAvg", "SCAFFOLD"], monkeypatch))
    fresh = strength_table([0], ["FedAvg"], monkeypatch)
    ran = []

    def run(cmd: list[str], **kwargs):
        ran.append((cmd, kwargs["env"]["OMP_NUM_THREADS"]))
        out = Path(cmd[cmd.index("--out") + 1])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(fresh)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(check, "subprocess", SimpleNamespace(run=run))
    assert check.main([str(table), "--rows", "FedAvg", "--runs", str(tmp_path / "f1")]) == 0
    out = capsys.readouterr().out
    assert ran[0][0][1].endswith("experiments/fedegg_study.py") and ran[0][1] == "1"
    assert ran[0][0][ran[0][0].index("--seeds") + 1 :][:2] == ["0", "--runs"]
    # 2 settings x (alone + 4 variants x (Δ, guided, ratio)) per-seed cells judged; 2 x 4 intervals not judged
    assert "26 of 26 cells equal" in out and out.count("(no per-seed value, not judged)") == 8

    committed = table.read_text()
    row = next(line for line in committed.splitlines() if line.startswith("| FedAvg |"))
    guided = row.split(" | ")[3]  # "g0 / g1 / g2" of + LH in Dir(0.1)
    g = guided.split(" / ")
    for edited, status in ((f"{int(g[0]) + 1} / {g[1]} / {g[2]}", 1), (f"{g[0]} / {int(g[1]) + 1} / {g[2]}", 0)):
        table.write_text(committed.replace(row, row.replace(f" | {guided} | ", f" | {edited} | ", 1), 1))
        assert check.main([str(table), "--rows", "FedAvg", "--runs", str(tmp_path / f"f{status}")]) == status
        out = capsys.readouterr().out
        assert ("**DIFFERS** (sampled seeds: " + f"{int(g[0]) + 1} vs {g[0]})" in out) is bool(status), out
