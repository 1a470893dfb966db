"""`flsuite compare` on two hand-made studies whose numbers are checked by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flsuite.compare import (
    compare,
    find_runs,
    group_by_experiment,
    group_by_parent,
    load_run,
    main,
    method_label,
    run_traffic,
)
from flsuite.metrics import domain_summary, final_summary
from flsuite.seeding import label_key
from tests.helpers import load_experiment

METHODS = {"fedavg": "flsuite.methods.fedavg.FedAvg", "fedprox": "flsuite.methods.fedprox.FedProx"}


def make_run(
    path: Path,
    accs: list[dict[str, float]],
    last_k: int,
    bytes_up: list[int] | None = None,
    round_s: list[float] | None = None,
    finished: bool = True,
    config: dict | None = None,
) -> Path:
    """A run folder as `flsuite fit` writes it: metrics.jsonl, timings.jsonl, config.yaml and summary.json. The
    config names the method of a `fedavg`/`fedprox` parent folder and the seed of a `seed<k>` folder."""
    path.mkdir(parents=True)
    history = []
    for i, acc in enumerate(accs):
        record = {"round": i + 1, "clients": [0, 1], **domain_summary(acc), "bytes_down": 1024}
        if bytes_up:
            record["bytes_up"] = bytes_up[i]
        history.append(record)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    times = round_s or [1.0] * len(accs)
    (path / "timings.jsonl").write_text(
        "".join(json.dumps({"round": i + 1, "time/round_s": t}) + "\n" for i, t in enumerate(times))
    )
    base = {"name": path.parent.name, "last_k": last_k, "rounds": len(accs), "run_dir": str(path)}
    if path.parent.name in METHODS:
        base["method"] = {"class_path": METHODS[path.parent.name], "init_args": {"weighting": "samples"}}
    if path.name.startswith("seed"):
        base["seed"], overrides = label_key(path.name)
        if overrides.startswith("train"):
            base["train_seed"] = int(overrides.removeprefix("train"))
    (path / "config.yaml").write_text(yaml.safe_dump(base | (config or {})))
    if finished:
        (path / "summary.json").write_text(json.dumps(final_summary(history, last_k)))
    return path


@pytest.fixture
def studies(tmp_path: Path) -> Path:
    a = tmp_path / "studyA"
    # fedavg seed 0: last-2 means x=65, y=45 -> AVG 55, STD 10, STD(n-1) 14.142; acc_mean 40, 50, 60
    make_run(
        a / "fedavg" / "seed0",
        [{"x": 50, "y": 30}, {"x": 60, "y": 40}, {"x": 70, "y": 50}],
        2,
        [100, 200, 300],
        [1, 2, 3],
    )
    # fedavg seed 1: last-2 means x=55, y=45 -> AVG 50, STD 5, STD(n-1) 7.071; acc_mean 40, 50, 50
    make_run(
        a / "fedavg" / "seed1",
        [{"x": 40, "y": 40}, {"x": 50, "y": 50}, {"x": 60, "y": 40}],
        2,
        [400, 400, 400],
        [4, 4, 4],
    )
    # fedprox seed 0: last-2 means x=85, y=65 -> AVG 75, STD 10; acc_mean 70, 80
    make_run(a / "fedprox" / "seed0", [{"x": 80, "y": 60}, {"x": 90, "y": 70}], 2, [10, 30], [0.5, 0.5])
    make_run(a / "fedprox" / "seed1", [{"x": 10, "y": 10}], 2, finished=False)  # killed: skipped
    b = tmp_path / "studyB"
    # a single-domain study with last_k = 3 whose run is shorter than that (2 rounds)
    make_run(b / "fedavg" / "seed0", [{"all": 20}, {"all": 30}], 3)
    make_run(b / "fedavg" / "seed1", [{"all": 40}, {"all": 60}], 3)
    return tmp_path


def test_study_a_numbers_by_hand(studies: Path):
    runs, skipped = find_runs([studies / "studyA"])
    assert skipped == [studies / "studyA" / "fedprox" / "seed1"]
    groups = group_by_parent(runs)
    assert list(groups) == ["fedavg", "fedprox"] and len(groups["fedavg"]) == 2
    c = compare(groups, target=55.0, skipped=skipped)
    header, rows = c.accuracy_rows()
    assert header == ["method", "x", "y", "AVG", "STD", "STD (n-1)", "seeds"]
    # x: 65, 55 -> 60 ± 5; y: 45, 45; AVG 55, 50; STD 10, 5; STD(n-1) (14.142 + 7.071) / 2 = 10.61 ± 3.54
    assert rows[0] == ["fedavg", "60.00 ± 5.00", "45.00 ± 0.00", "52.50 ± 2.50", "7.50 ± 2.50", "10.61 ± 3.54", "2"]
    assert rows[1] == ["fedprox", "85.00", "65.00", "75.00", "10.00", "14.14", "1"]
    header, rows = c.cost_rows()
    assert header[2] == "rounds to 55%"
    # fedavg: seed 0 reaches 55 in round 3, seed 1 never; bytes up 200 and 400 per round -> 300 B; per run 600 and
    # 1200 -> 900 B up, 3 x 1 KiB down; 2 s and 4 s -> 3 s
    assert header[3:] == ["bytes up / round", "bytes down / round", "bytes up / run", "bytes down / run", "s / round"]
    assert rows[0] == ["fedavg", "2", "3.0 (1/2)", "300 B", "1.0 KiB", "900 B", "3.0 KiB", "3.00"]
    assert rows[1] == ["fedprox", "2", "1.0 (1/1)", "20 B", "1.0 KiB", "40 B", "2.0 KiB", "0.50"]


def test_a_protocol_of_phases_is_costed_whole(tmp_path: Path):
    """FKPL's shape: a query phase, prefixed expert rounds, a final phase whose record repeats stage totals."""
    run = tmp_path / "fkpl" / "seed0"
    run.mkdir(parents=True)
    history = [
        {"round": 0, "phase": "cluster", "bytes_up": 512},  # the subspace query's bytes: counted once, from the summary
        *(
            {
                "round": r,
                "phase": f"experts/expert{v}",
                f"expert{v}/clients": [v],
                f"expert{v}/bytes_up": 100 * (v + 1),
                f"expert{v}/bytes_down": 10 * (v + 1),
            }
            for v in (0, 1)
            for r in (1, 2)
        ),
        {
            "round": 1,
            "phase": "calibrate",
            **domain_summary({"x": 80.0, "y": 60.0}),
            "stage1/bytes_up": 600,
            "stage2/bytes_up": 7000,
        },
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    (run / "timings.jsonl").write_text(
        "".join(
            json.dumps(t) + "\n"
            for t in [
                {"round": 0, "phase": "cluster", "time/cluster_s": 9.0},
                {"round": 1, "phase": "experts/expert0", "expert0/time/round_s": 1.0},
                {"round": 1, "phase": "experts/expert1", "expert1/time/round_s": 3.0},
            ]
        )
    )
    summary = final_summary(history[-1:], 1) | {
        "query/fkpl/subspace/bytes_up": 512,
        "query/fkpl/subspace/bytes_down": 0,
        "query/fkpl/virtual/bytes_up": 7000,
        "query/fkpl/virtual/bytes_down": 40000,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "setup.json").write_text(
        json.dumps({"setup/ggeur/bytes_up": 2048, "setup/ggeur/bytes_down": 1024, "fkpl/stage2/bytes_up": 7000})
    )
    _, rows = compare({"FKPL": [run]}).cost_rows()
    # rounds: up 100, 100, 200, 200 -> 150 per round, 600 in all; down 10, 10, 20, 20 -> 15, 60.
    # run: 600 + 512 + 7000 + 2048 = 10160 B = 9.9 KiB up; 60 + 0 + 40000 + 1024 = 41084 B = 40.1 KiB down (the
    # calibrate record's stage totals and setup.json's fkpl/ key are not counted again); s / round (1 + 3) / 2
    assert run_traffic(load_run(run)) == (10160.0, 41084.0)
    assert rows[0] == ["FKPL", "1", "—", "150 B", "15 B", "9.9 KiB", "40.1 KiB", "2.00"]


def test_study_b_reads_its_own_last_k_and_says_when_runs_were_shorter(studies: Path):
    runs, _ = find_runs([str(studies / "studyB" / "*" / "seed*")])
    c = compare(group_by_parent(runs))
    header, rows = c.accuracy_rows()
    # last-3 over 2 rounds: 25 and 50 -> 37.50 ± 12.50; one domain: STD 0, no sample STD
    assert header == ["method", "all", "AVG", "STD", "STD (n-1)", "seeds"]
    assert rows == [["fedavg", "37.50 ± 12.50", "37.50 ± 12.50", "0.00 ± 0.00", "—", "2"]]
    assert c.cost_rows()[1][0][:3] == ["fedavg", "3 (a run averaged only 2)", "—"]
    assert (
        "averaged over each run's last 2 evaluated rounds (last_k = 3, but the runs evaluated only 2)" in c.markdown()
    )
    assert c.remark() == "" and "Note:" not in c.markdown()  # both runs ran and averaged 2 rounds


def test_two_studies_together_label_by_path_and_reject_mixed_last_k(studies: Path):
    runs, _ = find_runs([studies / "studyA", studies / "studyB"])
    groups = group_by_parent(runs)
    assert list(groups) == ["studyA/fedavg", "studyA/fedprox", "studyB/fedavg"]
    c = compare(groups)
    assert [g.k for g in c.groups] == [2, 2, 3] and c.domains == ["x", "y", "all"]
    with pytest.raises(ValueError, match="different experiments .*last_k"):
        compare({"mixed": groups["studyA/fedavg"] + groups["studyB/fedavg"]})
    with pytest.raises(ValueError, match="different last_k"):  # grouped across configs on purpose (--by KEY)
        compare({"mixed": groups["studyA/fedavg"] + groups["studyB/fedavg"]}, across_configs=True)


def test_cli_writes_markdown_html_with_embedded_png(studies: Path, tmp_path: Path, capsys):
    out = tmp_path / "report"
    assert main([str(studies / "studyA"), "--out", str(out), "--target", "55", "--title", "Study A"]) == 0
    md = (out / "compare.md").read_text()
    assert "| FedAvg | 60.00 ± 5.00 | 45.00 ± 0.00 | 52.50 ± 2.50 | 7.50 ± 2.50 | 10.61 ± 3.54 | 2 |" in md
    assert "![convergence](convergence.png)" in md and "fedprox/seed1" in md  # the skipped run is named
    page = (out / "compare.html").read_text()
    assert "src='data:image/png;base64," in page and "<td>52.50 ± 2.50</td>" in page and "src='http" not in page
    assert (out / "convergence.png").read_bytes()[:4] == b"\x89PNG"
    assert "Study A" in capsys.readouterr().out


def test_missing_inputs_name_the_path(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        find_runs([tmp_path / "nowhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no finished run folder"):
        find_runs([tmp_path / "empty"])


def table4_compare(runs: Path, monkeypatch, capsys) -> str:
    """What `python experiments/ggeur_table4_compare.py --runs RUNS` prints."""
    monkeypatch.setattr(sys, "argv", ["ggeur_table4_compare.py", "--runs", str(runs)])
    load_experiment("ggeur_table4_compare").main()
    return capsys.readouterr().out


def test_study_script_table_is_compare_with_variant_labels(studies: Path):
    study = load_experiment("study")
    variants = [("FedAvg", ""), ("FedProx", "configs/baselines/fedprox.yaml"), ("Never ran", "x.yaml")]
    text = study.table("Study A", variants, [0, 1], studies / "studyA", "python experiments/study.py ...")
    assert "| FedAvg | 60.00 ± 5.00 | 45.00 ± 0.00 | 52.50 ± 2.50 | 7.50 ± 2.50 | 10.61 ± 3.54 | 2 |" in text
    assert "| FedProx | 85.00 | 65.00 | 75.00 | 10.00 | 14.14 | 1 |" in text and "Never ran" not in text
    assert text.startswith("## Study A") and "python experiments/study.py ..." in text


def test_old_summaries_get_the_papers_std_and_table4_script_reads_their_prefix(tmp_path: Path, monkeypatch, capsys):
    run = make_run(tmp_path / "t4" / "fedavg" / "seed0", [{"x": 50, "y": 70}, {"x": 70, "y": 50}], 2)
    summary = json.loads((run / "summary.json").read_text())
    summary["last2/acc_std"] = 10.0  # as written before: the mean of the per-round stds
    (run / "summary.json").write_text(json.dumps(summary))
    make_run(tmp_path / "t4" / "fedavg-ggeur" / "seed0", [{"x": 60, "y": 80}, {"x": 80, "y": 60}], 2)
    c = compare(group_by_parent(find_runs([tmp_path / "t4"])[0]))
    assert c.accuracy_rows()[1][0][3:6] == ["60.00", "0.00", "0.00"]  # both last-2 means are 60: std across domains 0

    assert (
        "| FedAvg | 60.00 → 70.00 (+10.00) | 1/1 | —, —: not resolved (1 pair) | 0.00 → 0.00 (+0.00) | 0/1 |"
        in table4_compare(tmp_path / "t4", monkeypatch, capsys)
    )


def test_ggeur_table4_compare_pairs_the_folders_of_a_training_seed_grid(tmp_path: Path, monkeypatch, capsys):
    """Runs named `seed<S>-train<T>` (experiments/study.py --train_seeds) pair by both seeds, not by the data seed."""
    for slug, accs in (("fedavg", (50, 70)), ("fedavg-ggeur", (60, 80))):
        for train, shift in ((1, 0), (2, 10)):
            make_run(
                tmp_path / "t4" / slug / f"seed0-train{train}", [{"x": accs[0] + shift, "y": accs[1] + shift}] * 2, 2
            )
    assert "| FedAvg | 65.00 → 75.00 (+10.00) | 2/2 |" in table4_compare(tmp_path / "t4", monkeypatch, capsys)


def test_ggeur_table4_compare_states_the_change_as_a_paired_difference(tmp_path: Path, monkeypatch, capsys):
    """Seeds far apart, the change per seed +10 / +12 / +14: paired, SE = 2 / √3 = 1.15 and the 95 % interval
    12 ± t(0.975, 2) · SE = 12 ± 4.97, resolved (unpaired, the seeds' spread of 20 points would swamp it)."""
    for seed, (base, gain) in enumerate(((40, 10), (60, 12), (80, 14))):
        make_run(tmp_path / "t4" / "fedavg" / f"seed{seed}", [{"x": base, "y": base}] * 2, 2)
        make_run(tmp_path / "t4" / "fedavg-ggeur" / f"seed{seed}", [{"x": base + gain, "y": base + gain}] * 2, 2)
    assert "| FedAvg | 60.00 → 72.00 (+12.00) | 3/3 | 1.15, [+7.03, +16.97]: resolved |" in table4_compare(
        tmp_path / "t4", monkeypatch, capsys
    )


def test_group_by_config_keys(tmp_path: Path, capsys):
    for n, (mu, accs) in enumerate([(0.1, [50, 70]), (0.01, [60, 60]), (0.1, [70, 90])]):
        run = make_run(tmp_path / "trials" / f"{n:04d}", [{"x": accs[0], "y": accs[1]}], 1)
        config = yaml.safe_load((run / "config.yaml").read_text())
        config.update({"method": {"init_args": {"mu": mu}}, "setup": [{"init_args": {"top_k": 8}}]})
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    runs, _ = find_runs([tmp_path / "trials"])
    assert main([str(tmp_path / "trials"), "--by", "method.init_args.mu", "setup.init_args.top_k"]) == 0
    out = capsys.readouterr().out
    assert "| mu=0.01, top_k=8 | 60.00 | 60.00 | 60.00 | 0.00 | 0.00 | 1 |" in out
    assert (
        "| mu=0.1, top_k=8 | 60.00 ± 10.00 | 80.00 ± 10.00 | 70.00 ± 10.00 | 10.00 ± 0.00 | 14.14 ± 0.00 | 2 |" in out
    )
    from flsuite.compare import group_by_config

    with pytest.raises(KeyError, match="no config key 'method.init_args.nope'"):
        group_by_config(runs, ["method.init_args.nope"])


def test_flsuite_compare_subcommand(studies: Path, capsys):
    from flsuite.cli import main as flsuite_main

    assert flsuite_main(["compare", str(studies / "studyA" / "fedprox")]) == 0
    assert "| FedProx | 85.00 | 65.00 | 75.00 | 10.00 | 14.14 | 1 |" in capsys.readouterr().out
    assert flsuite_main(["compare", str(studies / "nowhere")]) == 2  # a user error: one paragraph naming the path
    assert "nowhere: no such run folder" in capsys.readouterr().err


def test_study_refuses_to_mix_runs_given_other_fit_flags(tmp_path: Path):
    """A finished run made with `-- --rounds 50` and a rerun without them would share one table: stopped, named."""
    root = Path(__file__).resolve().parents[2]
    run = make_run(tmp_path / "runs" / "s" / "base" / "seed0", [{"x": 50.0}], 1)
    argv = [
        "cli.py",
        "fit",
        "--config",
        "b.yaml",
        "--seed",
        "0",
        "--progress",
        "false",
        "--wandb.enabled",
        "false",
        "--rounds",
        "50",
    ]
    (run / "environment.json").write_text(json.dumps({"argv": argv}))
    cmd = [
        sys.executable,
        str(root / "experiments" / "study.py"),
        "--name",
        "s",
        "--base",
        "b.yaml",
        "--variant",
        "base=",
        "--seeds",
        "0",
        "--runs",
        str(tmp_path / "runs"),
    ]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert (
        f"{run} was run with the extra flsuite fit flags --rounds 50, but this invocation passes (none)" in done.stderr
    )


def fedprox(mu: float) -> dict:
    return {
        "method": {"class_path": "flsuite.methods.fedprox.FedProx", "init_args": {"mu": mu, "weighting": "samples"}}
    }


def test_two_methods_in_one_folder_are_two_rows_and_two_seeds_are_one(tmp_path: Path):
    """Runs made with --run_dir side by side: grouped by config, not by the folder they share."""
    runs = tmp_path / "runs"
    fedavg = {"method": {"class_path": "flsuite.methods.fedavg.FedAvg", "init_args": {"weighting": "samples"}}}
    make_run(runs / "a", [{"x": 50.0}], 1, config=fedavg | {"seed": 0})
    make_run(runs / "b", [{"x": 70.0}], 1, config=fedprox(0.01) | {"seed": 0})
    make_run(
        runs / "c",
        [{"x": 60.0}],
        1,
        config=fedavg | {"seed": 1, "threads": {"intra_op": 2}, "wandb": {"mode": "offline"}},
    )
    groups = group_by_experiment(find_runs([runs / "a", runs / "b", runs / "c"])[0])
    assert groups == {"FedAvg": [runs / "a", runs / "c"], "FedProx": [runs / "b"]}
    rows = compare(groups).accuracy_rows()[1]
    assert [r[0] for r in rows] == ["FedAvg", "FedProx"] and rows[0][-1] == "2" and rows[0][1] == "55.00 ± 5.00"
    make_run(runs / "d", [{"x": 40.0}], 1, config=fedavg | {"seed": 1})  # seed 1 again: a repeat, not a third seed
    assert compare(group_by_experiment(find_runs([runs])[0])).accuracy_rows()[1][0][-1] == "2 (3 runs)"


def test_groups_of_one_method_are_labelled_by_the_keys_that_differ(tmp_path: Path, capsys):
    for name, mu, seed, acc in [("p1", 0.01, 0, 50.0), ("p2", 0.1, 0, 60.0), ("p3", 0.01, 1, 70.0)]:
        make_run(tmp_path / "runs" / name, [{"x": acc}], 1, config=fedprox(mu) | {"seed": seed})
    make_run(
        tmp_path / "runs" / "g",
        [{"x": 80.0}],
        1,
        config=fedprox(0.1) | {"setup": [{"class_path": "flsuite.methods.ggeur.GGEUR"}]},
    )
    assert main([str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "| FedProx (method.init_args.mu=0.01) | 60.00 ± 10.00 | 60.00 ± 10.00 |" in out
    assert "| FedProx (method.init_args.mu=0.1) | 60.00 | 60.00 |" in out
    assert "| FedProx+GGEUR | 80.00 |" in out  # another method label: no keys needed to tell it apart


def test_folder_and_labelled_groups_that_mix_experiments_are_refused(tmp_path: Path):
    make_run(tmp_path / "mixed" / "seed0", [{"x": 50.0}], 1, config=fedprox(0.01))
    make_run(tmp_path / "mixed" / "seed1", [{"x": 60.0}], 1, config=fedprox(0.1))
    assert len(group_by_experiment(find_runs([tmp_path / "mixed"])[0])) == 2
    with pytest.raises(ValueError, match=r"group 'mixed' holds runs of different experiments .*method.init_args.mu"):
        main([str(tmp_path / "mixed"), "--by", "folder"])
    with pytest.raises(ValueError, match=r"group 'both' holds runs .*method.init_args.mu"):
        compare({"both": sorted((tmp_path / "mixed").iterdir())})
    assert len(compare({"both": sorted((tmp_path / "mixed").iterdir())}, across_configs=True).groups) == 1


def test_method_label_is_the_dashboards_job_type():
    from flsuite.data.builtin import GaussianFeatures
    from flsuite.methods.fedavg import FedAvg
    from flsuite.methods.ggeur import GGEUR
    from flsuite.tracking import run_labels

    config = {
        "method": {"class_path": "flsuite.methods.fedavg.FedAvg"},
        "setup": [{"class_path": "flsuite.methods.ggeur.GGEUR"}],
    }
    assert method_label(config) == run_labels(FedAvg(), GaussianFeatures(), [GGEUR()])["method_name"] == "FedAvg+GGEUR"
    assert method_label({"method": {"class_path": "FedProx"}, "setup": None}) == "FedProx" and method_label({}) is None


def test_real_runs_side_by_side_compare_as_two_methods(tmp_path: Path, capsys):
    """`flsuite fit --run_dir` a FedAvg and a FedProx run (and a second FedAvg seed) into one folder, then compare."""
    from flsuite.cli import main as flsuite_main

    base = [
        "fit",
        "--rounds",
        "1",
        "--progress",
        "false",
        "--wandb.enabled",
        "false",
        "--data",
        "GaussianFeatures",
        "--data.init_args.dim",
        "8",
        "--data.init_args.samples_per_client",
        "32",
        "--model",
        "Linear",
    ]
    for name, extra in [("fedavg0", []), ("fedavg1", ["--seed", "1"]), ("fedprox0", ["--method", "FedProx"])]:
        assert flsuite_main([*base, *extra, "--run_dir", str(tmp_path / "runs" / name)]) == 0
    capsys.readouterr()
    assert flsuite_main(["compare", str(tmp_path / "runs")]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| Fed")]
    assert [(r[0], r[-1]) for r in rows[:2]] == [("| FedAvg", "2 |"), ("| FedProx", "1 |")]


def test_labels_name_every_key_that_differs_so_they_are_unique(tmp_path: Path):
    """Two FedProx groups differing in five keys, a third in one of them: each label lists all its differing keys."""
    local = {"lr": 0.1, "epochs": 1, "batch_size": 16, "momentum": 0.9, "weight_decay": 0.0}
    other = {"lr": 0.2, "epochs": 2, "batch_size": 32, "momentum": 0.5, "weight_decay": 1e-4}
    for name, values in [("a", local), ("b", other), ("c", local | {"lr": 0.2})]:
        make_run(tmp_path / name, [{"x": 50.0}], 1, config=fedprox(0.01) | {"local": values})
    labels = list(group_by_experiment([tmp_path / n for n in "abc"]))
    assert len(set(labels)) == 3
    assert labels[0] == (
        "FedProx (local.batch_size=16, local.epochs=1, local.lr=0.1, local.momentum=0.9, local.weight_decay=0.0)"
    )


def test_the_header_says_how_many_rounds_were_averaged_and_a_remark_names_groups_that_differ(tmp_path: Path):
    """A 30-round and a 6-round run in one table get a remark naming both; the header counts the rounds averaged."""

    made = [
        make_run(tmp_path / "a" / m / "seed0", [{"x": 50.0, "y": 5.0}] * n, 5)
        for m, n in (("fedavg", 30), ("fedprox", 6))
    ]
    c = compare(group_by_experiment(made))
    assert "averaged over each run's last 5 evaluated rounds;" in c.note()
    assert (
        c.remark()
        == "Note: the runs differ in rounds run (FedAvg: 30, FedProx: 6), so the numbers are not like for like."
    )
    assert f"**{c.remark()}**" in c.markdown() and f"<strong>{c.remark()}</strong>" in c.html("t")

    made = [
        make_run(tmp_path / "b" / m / "seed0", [{"x": 50.0, "y": 5.0}] * n, 5)
        for m, n in (("fedavg", 30), ("fedprox", 3))
    ]
    c = compare(group_by_experiment(made))
    assert "averaged over each run's last 3 to 5 evaluated rounds (see the last-k column);" in c.note()
    assert c.remark() == (
        "Note: the runs differ in rounds run (FedAvg: 30, FedProx: 3) and in rounds averaged (FedAvg: 5, "
        "FedProx: 3), so the numbers are not like for like."
    )

    made = [make_run(tmp_path / "c" / m / "seed0", [{"x": 50.0, "y": 5.0}] * 3, 5) for m in ("fedavg", "fedprox")]
    c = compare(group_by_experiment(made))
    assert "averaged over each run's last 3 evaluated rounds (last_k = 5, but the runs evaluated only 3);" in c.note()
    assert c.remark() == ""

    seeds = [
        make_run(tmp_path / "d" / "fedavg" / f"seed{s}", [{"x": 50.0, "y": 5.0}] * n, 5) for s, n in ((0, 4), (1, 8))
    ]
    c = compare(
        {"FedAvg": seeds}, across_configs=True
    )  # one group whose runs differ (grouped across configs, --by KEY)
    assert c.remark() == (
        "Note: the runs differ in rounds run (FedAvg: 4–8) and in rounds averaged (FedAvg: 4–5), so the "
        "numbers are not like for like."
    )
