"""experiments/regenerate_check.py (issue 38, item 5): a committed table's sampled rows rerun from its own command and
diffed cell by cell: a table its command regenerates passes, a changed cell is reported as committed vs fresh."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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
    assert argv == ["--name", "s", "--base", "b.yaml", "--variant", "+ X=x.yaml", "--seeds", "0", "1", "--workers", "2"] + [
        "--runs",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "o.md"),
        "--",
        "--rounds",
        "3",
    ]
    grid = "python experiments/study.py --name s --base b.yaml --variant 'P [mu 1]=--m=1' --variant 'P [mu 2]=--m=2' --variant Q= --select_on val"
    kept = check.sample_argv(grid, ["P [mu 2]"], tmp_path, tmp_path / "o.md", 1)
    assert [kept[i + 1] for i, a in enumerate(kept) if a == "--variant"] == ["P [mu 1]=--m=1", "P [mu 2]=--m=2"]  # the group
    with pytest.raises(SystemExit, match="not `python experiments/study.py ...` but 'bash experiments/x.sh'"):
        check.sample_argv("bash experiments/x.sh", ["A"], tmp_path, tmp_path / "o.md", None)
    with pytest.raises(SystemExit, match=r"row\(s\) \['Z'\] are not variants"):
        check.sample_argv(command, ["Z"], tmp_path, tmp_path / "o.md", None)


@pytest.mark.slow
def test_a_table_regenerates_and_a_changed_cell_is_reported(check, tmp_path: Path, monkeypatch, capsys):
    """A two-variant quickstart study (2 rounds, seed 0) writes the committed table; the check reruns its FedAvg row
    from the table's command: every cell equal. With one cell of that row edited, the check exits 1 and prints the
    committed and the fresh value of that cell."""
    study = load_experiment("study")
    table = tmp_path / "t.md"
    monkeypatch.chdir(ROOT)
    argv = ["study.py", "--name", "t", "--base", "configs/quickstart.yaml", "--variant", "FedAvg=", "--variant", "lr 0.05=--local.lr=0.05"]
    argv += ["--seeds", "0", "--workers", "2", "--runs", str(tmp_path / "runs"), "--out", str(table), "--", "--rounds", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    study.main()
    capsys.readouterr()
    committed = table.read_text()
    row = next(line for line in committed.splitlines() if line.startswith("| FedAvg |"))

    assert check.main([str(table), "--rows", "FedAvg", "--runs", str(tmp_path / "fresh1")]) == 0
    out = capsys.readouterr().out
    avg = row.split("|")[-5].strip()  # the AVG column: | method | 4 domains | AVG | STD | STD (n-1) | seeds |
    assert f"| 1 | FedAvg | AVG | {avg} | {avg} | same |" in out and "DIFFERS" not in out
    assert "| 3 | FedAvg | bytes up / run |" in out and "| 3 | FedAvg | s / round |" in out and "(wall time, not judged)" in out
    assert "lr 0.05" not in out and not (tmp_path / "fresh1" / "t" / "lr-0-05").exists()  # only the sample ran

    edited = row.replace(f"| {avg} |", "| 99.99 |", 1)
    table.write_text(committed.replace(row, edited))
    assert check.main([str(table), "--rows", "FedAvg", "--runs", str(tmp_path / "fresh2")]) == 1
    out = capsys.readouterr().out
    assert f"| 1 | FedAvg | AVG | 99.99 | {avg} | **DIFFERS** |" in out and "1 differ" in out
