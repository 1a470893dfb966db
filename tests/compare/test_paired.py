"""experiments/paired.py: seed-paired differences, their SE and 95 % interval, on constructed runs whose per-seed
accuracies are known (the numbers computed by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compare.test_study_selection import make_run
from tests.helpers import load_experiment


def load_paired():
    return load_experiment("paired")


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Variant a: 80, 70, 90 on seeds 0-2; b: 75, 72 on seeds 0-1 (seed 2 unfinished)."""
    for name, accs in {"a": (80, 70, 90), "b": (75, 72)}.items():
        for seed, acc in enumerate(accs):
            make_run(tmp_path / name / f"seed{seed}", acc, None, {})
    (tmp_path / "b" / "seed2").mkdir()  # started, never finished: no summary.json
    return tmp_path


def test_differences_are_per_seed_over_the_seeds_both_finished(runs: Path):
    # +5 and -2: mean 1.5, sample std sqrt(24.5) = 4.9497, SE 4.9497 / sqrt(2) = 3.5, t(0.975, 1) = 12.7062:
    # 1.5 -/+ 44.4717 = [-42.97, +45.97], which holds 0
    assert (
        load_paired().paired_row(runs, "a - b", "acc_mean")
        == "| a − b | +1.50 | 3.50 | [-42.97, +45.97] | +5.00, -2.00 | 1 of 2 | not resolved |"
    )


def test_a_domain_metric_reads_that_domains_accuracy(runs: Path):
    assert (
        load_paired().paired_row(runs, "b - a", "x")
        == "| b − a | -1.50 | 3.50 | [-45.97, +42.97] | -5.00, +2.00 | 1 of 2 | not resolved |"
    )


def test_three_pairs_by_hand_and_a_table_of_two_commits_is_flagged(tmp_path: Path, monkeypatch, capsys):
    """c − a: +1, +2, +3 (mean 2, SE 1/sqrt(3) = 0.5774, t(0.975, 2) = 4.3027: [-0.48, +4.48], not resolved);
    d − a: +3, +3, +4 (mean 3.3333, SE 1/3, [1.90, 4.77], resolved). Runs of two commits: a warning names both."""
    import json
    import sys

    for name, accs in {"a": (50, 60, 70), "c": (51, 62, 73), "d": (53, 63, 74)}.items():
        for seed, acc in enumerate(accs):
            make_run(tmp_path / name / f"seed{seed}", acc, None, {})
            commit = "1" * 40 if name == "d" else "2" * 40
            (tmp_path / name / f"seed{seed}" / "environment.json").write_text(
                json.dumps({"code": {"commit": commit, "dirty": False}})
            )
    monkeypatch.setattr(sys, "argv", ["paired.py", str(tmp_path), "c - a", "d - a"])
    load_paired().main()
    out = capsys.readouterr().out
    assert "| c − a | +2.00 | 0.58 | [-0.48, +4.48] | +1.00, +2.00, +3.00 | 3 of 3 | not resolved |" in out
    assert "| d − a | +3.33 | 0.33 | [+1.90, +4.77] | +3.00, +3.00, +4.00 | 3 of 3 | resolved |" in out
    # the table reads a and c (6 runs of commit 2...) and d (3 of commit 1...); a, read by both rows, counts once
    assert (
        "**Warning: these runs come from 2 code versions: 2222222222 (6 runs), 1111111111 (3 runs); a table "
        "should hold runs of one.**"
    ) in out


@pytest.mark.parametrize(
    ("pair", "metric", "message"),
    [
        ("a", "acc_mean", "a pair is 'A - B'"),
        ("a - c", "acc_mean", r"no variant folder c under .* \(variants there: a, b\)"),
        ("a - b", "z", r"seed0/summary.json has no 'last1/acc/z' \(domains: x, y\)"),
    ],
)
def test_bad_pairs_and_metrics_are_named(runs: Path, pair: str, metric: str, message: str):
    with pytest.raises((SystemExit, KeyError), match=message):
        load_paired().paired_row(runs, pair, metric)
