"""experiments/paired.py: seed-paired differences, on constructed runs whose per-seed accuracies are known."""

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
    assert load_paired().paired_row(runs, "a - b", "acc_mean") == "| a − b | +1.50 | +5.00, -2.00 | 1 of 2 |"


def test_a_domain_metric_reads_that_domains_accuracy(runs: Path):
    assert load_paired().paired_row(runs, "b - a", "x") == "| b − a | -1.50 | -5.00, +2.00 | 1 of 2 |"


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
