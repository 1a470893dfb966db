"""`flsuite compare`'s paired differences (mean, SE, 95 % interval, resolved or not) on hand-made runs whose numbers
are computed by hand, and its warning when a table's runs come from more than one code version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flsuite.compare import PairedDifference, compare, find_runs, main, paired_difference
from tests.compare.test_compare import fedprox, make_run

FEDAVG = {"method": {"class_path": "flsuite.methods.fedavg.FedAvg", "init_args": {}}}
T_975_1, T_975_2 = 12.706204736174694, 4.302652729749462  # Student's t, 97.5 % quantile, 1 and 2 degrees of freedom


def test_paired_difference_by_hand():
    d = paired_difference({0: 51.0, 1: 62.0, 2: 73.0, 3: 99.0}, {0: 50.0, 1: 60.0, 2: 70.0})  # seed 3: no pair
    assert d.diffs == (1.0, 2.0, 3.0) and d.n == 3 and d.mean == 2.0
    assert d.se == pytest.approx(1 / 3**0.5)  # sample std 1, over sqrt(3) pairs
    assert d.interval == pytest.approx((2 - T_975_2 / 3**0.5, 2 + T_975_2 / 3**0.5))  # (-0.484, 4.484): holds 0
    assert not d.resolved and d.cells() == ["+2.00", "0.58", "[-0.48, +4.48]", "not resolved"]
    d = PairedDifference((5.0, -2.0))  # SE sqrt(24.5) / sqrt(2) = 3.5
    assert d.se == pytest.approx(3.5) and d.interval == pytest.approx((1.5 - 3.5 * T_975_1, 1.5 + 3.5 * T_975_1))
    assert PairedDifference((3.0, 3.0, 4.0)).cells() == ["+3.33", "0.33", "[+1.90, +4.77]", "resolved"]  # SE 1/3
    assert PairedDifference((0.5,)).cells() == ["+0.50", "—", "—", "not resolved (1 pair)"]
    assert PairedDifference(()).cells() == ["—", "—", "—", "no pair"]
    assert PairedDifference((0.0, 0.0)).cells()[3] == "not resolved"  # an interval [0, 0] holds 0


@pytest.fixture
def study(tmp_path: Path) -> Path:
    """One domain, last_k 1 (AVG = the accuracy): FedAvg 50/60/70 on seeds 0-2 (seed 0 run twice: 50 and 52, mean 51),
    FedProx mu 0.01 52/62/73 (differences +1/+2/+3), FedProx mu 0.1 54/63/74 (+3/+3/+4), FedProx mu 1 on seed 0 only."""
    runs = {
        ("fedavg", 0): (50.0, FEDAVG),
        ("fedavg-again", 0): (52.0, FEDAVG),
        ("fedavg", 1): (60.0, FEDAVG),
        ("fedavg", 2): (70.0, FEDAVG),
        **{("mu0.01", s): (acc, fedprox(0.01)) for s, acc in enumerate((52.0, 62.0, 73.0))},
        **{("mu0.1", s): (acc, fedprox(0.1)) for s, acc in enumerate((54.0, 63.0, 74.0))},
        ("mu1", 0): (60.0, fedprox(1.0)),
    }
    for (name, seed), (acc, config) in runs.items():
        make_run(tmp_path / "runs" / name / f"seed{seed}", [{"x": acc}], 1, config=config)
    return tmp_path / "runs"


def test_compare_shows_each_groups_difference_from_the_reference_with_se_and_interval(study: Path, capsys):
    assert main([str(study)]) == 0
    out = capsys.readouterr().out
    assert "Paired differences of AVG against FedAvg, over the seeds both ran" in out
    assert "| method | Δ AVG vs FedAvg | SE | 95 % interval | pairs | verdict |" in out
    assert "| FedProx (method.init_args.mu=0.01) | +2.00 | 0.58 | [-0.48, +4.48] | 3 | not resolved |" in out
    assert "| FedProx (method.init_args.mu=0.1) | +3.33 | 0.33 | [+1.90, +4.77] | 3 | resolved |" in out
    assert "| FedProx (method.init_args.mu=1.0) | +9.00 | — | — | 1 | not resolved (1 pair) |" in out
    # the accuracy table is as before: FedAvg's mean over its 4 runs (50, 52, 60, 70), the repeat counted as a run
    assert "| FedAvg | 58.00 ± 7.87 | 58.00 ± 7.87 | 0.00 ± 0.00 | — | 3 (4 runs) |" in out


def test_the_reference_can_be_any_group(study: Path, capsys):
    label = "FedProx (method.init_args.mu=0.1)"
    assert main([str(study), "--reference", label]) == 0
    out = capsys.readouterr().out
    assert f"| method | Δ AVG vs {label} | SE | 95 % interval | pairs | verdict |" in out
    assert "| FedAvg | -3.33 | 0.33 | [-4.77, -1.90] | 3 | resolved |" in out
    with pytest.raises(ValueError, match=r"--reference 'FedNone' is not a group of this comparison \(groups: FedAvg, "):
        main([str(study), "--reference", "FedNone"])


def test_one_group_has_no_paired_table(study: Path):
    c = compare({"FedAvg": sorted((study / "fedavg").iterdir())})
    assert "Paired differences" not in c.markdown() and "Paired differences" not in c.html("t")


def code(commit: str, uncommitted: str | None = None) -> dict:
    return {"version": "0.1.0", "commit": commit, "dirty": uncommitted is not None, "uncommitted": uncommitted}


def test_a_table_of_runs_from_several_code_versions_is_flagged(study: Path):
    runs = find_runs([study])[0]
    for i, run in enumerate(runs):  # 11 runs: 5 at commit a..., 2 at a... with uncommitted changes, 4 without a record
        if i < 7:
            (run / "environment.json").write_text(
                json.dumps({"seed": 0, "code": code("a" * 40, "0123456789abcdef" if i >= 5 else None)})
            )
    c = compare({"all": runs}, across_configs=True)
    warning = (
        "Warning: these runs come from 3 code versions: aaaaaaaaaa (5 runs), no commit recorded (4 runs), "
        "aaaaaaaaaa + uncommitted 01234567 (2 runs); a table should hold runs of one."
    )
    assert c.code_warning() == warning
    assert f"**{warning}**" in c.markdown() and f"<strong>{warning}</strong>" in c.html("t")
    for run in runs[5:]:
        (run / "environment.json").write_text(json.dumps({"code": code("a" * 40)}))
    c = compare({"all": runs}, across_configs=True)
    assert c.code_warning() == "" and "Warning" not in c.markdown()


def test_folders_a_driver_moved_aside_are_not_runs_of_the_study(study: Path):
    moved = study / "fedavg" / ".replaced" / "old-seed0-20250101-000000"
    make_run(moved, [{"x": 10.0}], 1, config=FEDAVG)
    assert moved not in find_runs([study])[0] and len(find_runs([study])[0]) == 11
    assert find_runs([moved])[0] == [moved]  # named directly, it is still a run folder


def test_a_table_of_runs_from_several_kinds_of_cpu_is_flagged(study: Path):
    """The CPU's vector instructions decide a CPU run's last bits (README, Reproducibility): a table mixing them says
    so; runs that recorded none (made before the record) and one kind are no warning; a resume on another kind counts
    as a kind of its own."""
    runs = find_runs([study])[0]
    for i, run in enumerate(runs):  # 11 runs: 6 on AVX512, 2 on AVX2, 1 started on AVX2 resumed on AVX512, 2 without
        kinds = ["AVX512"] if i < 6 else ["AVX2"] if i < 8 else ["AVX2", "AVX512"] if i < 9 else []
        env = {"seed": 0, **({"cpu_capability": kinds[0]} if kinds else {})}
        (run / "environment.json").write_text(json.dumps(env | {"resumes": [{"cpu_capability": k} for k in kinds[1:]]}))
    c = compare({"all": runs}, across_configs=True)
    warning = (
        "Warning: these runs were made on 3 kinds of CPU (torch CPU capability): AVX512 (6 runs), AVX2 (2 runs), "
        "AVX2 then AVX512 (1 run); a rerun on one machine gives other last digits for some of them."
    )
    assert c.cpu_warning() == warning
    assert f"**{warning}**" in c.markdown() and f"<strong>{warning}</strong>" in c.html("t")
    for run in runs[6:9]:
        (run / "environment.json").write_text(json.dumps({"cpu_capability": "AVX512"}))
    c = compare({"all": runs}, across_configs=True)
    assert c.cpu_warning() == "" and "Warning" not in c.markdown()
