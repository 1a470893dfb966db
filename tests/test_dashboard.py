"""flsuite dashboard (issue 37), offline: the workspace, report and sweep specs round-trip through wandb-workspaces'
own model, name only keys that flsuite.records declares and that real runs log, group by job_type and filter by the
study's group; the missing extra is named."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from flsuite import records
from flsuite.dashboard import plan, spec
from flsuite.dashboard.keys import folders_keys, run_folder_keys
from flsuite.tracking import WandbConfig
from tests.helpers import head_federation

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))


def _fit_runs(root: Path) -> dict[str, Path]:
    """One tiny real run per kind of diagnostics: FedAvg, FedAvg + FedEGG, FedCiR, FKPL (W&B off)."""
    from flsuite.data.builtin import GaussianFeatures
    from flsuite.federation.server import PublicData
    from flsuite.federation.task import LocalTraining
    from flsuite.methods.fedcir import FedCiR
    from flsuite.methods.fedegg import FedEGG
    from flsuite.models.heads import MLP
    from flsuite.models.probabilistic import ProbabilisticEncoder
    from tests.methods.test_fkpl import fkpl_federation

    guiding = PublicData(
        GaussianFeatures(dim=8, num_classes=3, num_domains=1, clients_per_domain=1, samples_per_client=90)
    )
    sgd = LocalTraining(epochs=1, batch_size=16, lr=0.05, momentum=0.0, weight_decay=0.0)
    runs = {k: root / k for k in ("fedavg", "fedegg", "fedcir", "fkpl")}

    def config(method: str, **more: object) -> str:  # what compare reads: the W&B group (`name`) and the method
        return yaml.safe_dump({"name": "study", "method": {"class_path": f"flsuite.methods.{method}"}, **more})

    head_federation(runs["fedavg"], name="study", rounds=3).fit(config_yaml=config("fedavg.FedAvg"))
    egg = head_federation(
        runs["fedegg"],
        name="study",
        rounds=3,
        model=MLP(hidden=(16,)),
        local=sgd,
        server_steps=[FedEGG(guiding, tau=10.0)],
    )
    egg.fit(config_yaml=config("fedavg.FedAvg", server_steps=[{"class_path": "flsuite.methods.fedegg.FedEGG"}]))
    cir = head_federation(
        runs["fedcir"],
        name="study",
        rounds=2,
        model=ProbabilisticEncoder(hidden=[16], dim=8),
        method=FedCiR(lam_reg=0.5, lam_align=1e-3),
    )
    cir.fit(config_yaml=config("fedcir.FedCiR"))
    fkpl_federation(runs["fkpl"]).fit(config_yaml=config("fkpl.FKPL"))
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    return _fit_runs(tmp_path_factory.mktemp("runs"))


def _panels(workspace_spec: dict) -> list[dict]:
    if workspace_spec["kind"] == "workspace":
        sections = workspace_spec["spec"]["spec"]["section"]["panelBankConfig"]["sections"]
        return [p for s in sections for p in s["panels"]]
    grids = [b for b in workspace_spec["spec"]["spec"]["blocks"] if b["type"] == "panel-grid"]
    return [p for g in grids for p in g["metadata"]["panelBankSectionConfig"]["panels"]]


def metric_keys(saved: dict) -> set[str]:
    """Every metric key the saved spec's panels name (y metrics, x axes, parallel-coordinate summaries, importance
    targets), in flsuite's names; config columns left out."""
    keys: set[str] = set()
    for p in _panels(saved):
        config = p["config"]
        keys.update(config.get("metrics", []))
        keys.update([config["xAxis"]] if "xAxis" in config else [])
        keys.update([config["targetKey"]] if "targetKey" in config else [])
        keys.update(
            c["accessor"].removeprefix("summary:")
            for c in config.get("columns", [])
            if c["accessor"].startswith("summary:")
        )
    return keys


def config_columns(saved: dict) -> list[str]:
    """Config keys of parallel-coordinate columns, dotted as in flsuite's configs
    (`config:method.value.init_args.mu`)."""
    out = []
    for p in _panels(saved):
        for c in p["config"].get("columns", []):
            if c["accessor"].startswith("config:"):
                out.append(c["accessor"].removeprefix("config:").replace(".value", "", 1))
    return out


def _round_trips(obj) -> dict:
    saved = spec.to_spec(obj)
    assert spec.to_spec(spec.from_spec(json.loads(json.dumps(saved)))) == saved
    return saved


def test_the_workspace_names_only_declared_keys_that_real_runs_log(runs):
    keys = folders_keys(runs.values())
    view = plan.project_view(keys, plan.RunFilter(group="study"))
    saved = _round_trips(spec.workspace(view, "", "flsuite"))
    named = metric_keys(saved)
    assert named == view.metric_keys() | {records.ROUND}
    assert all(records.is_declared(k) for k in named), sorted(k for k in named if not records.is_declared(k))
    assert named - {records.ROUND} <= keys.history | keys.summary, sorted(
        named - keys.history - keys.summary - {records.ROUND}
    )
    names = [s.name for s in view.sections]
    assert {"FedEGG", "FedCiR", "FKPL", "Communication", "Time per round", "Convergence"} <= set(names)
    for domain in ("domain0", "domain1"):
        assert f"{records.ACC_PREFIX}{domain}" in named and f"last5/{records.ACC_PREFIX}{domain}" in named


def test_each_declared_diagnostic_is_logged_by_its_method(runs):
    """A key renamed where a method writes it (or in records.py) fails here and in the test above."""
    by_run = {name: run_folder_keys(path) for name, path in runs.items()}
    expected = {
        "fedavg": (
            records.TOTAL_BYTES_UP,
            records.TOTAL_BYTES_DOWN,
            records.ROUND_SECONDS,
            records.ACC_MEAN,
            "last5/acc_std_sample",
        ),
        "fedegg": (records.FEDEGG_UPDATE_RATIO, records.FEDEGG_GATE),
        "fedcir": records.FEDCIR_LOSS_SHARES,
        "fkpl": (*records.FKPL_STAGE_BYTES_UP, *records.FKPL_STAGE_BYTES_DOWN, *records.FKPL_STAGE_SECONDS),
    }
    for name, keys in expected.items():
        assert [k for k in keys if not by_run[name].has(k)] == [], name
    assert not by_run["fedavg"].has(records.FEDEGG_GATE)
    assert [
        s.name for s in plan.project_view(by_run["fedavg"]).sections if s.name in ("FedEGG", "FedCiR", "FKPL")
    ] == []


def test_the_workspace_groups_by_job_type_and_filters_by_group_or_tag(runs):
    keys = folders_keys([runs["fedavg"]])
    saved = spec.to_spec(spec.workspace(plan.project_view(keys, plan.RunFilter(group="study")), "", "flsuite"))
    runset = saved["spec"]["spec"]["section"]["runSets"][0]
    assert runset["grouping"] == [{"section": "run", "name": "jobType"}]
    assert [(f["key"], f["op"], f["value"]) for f in runset["filters"]["filters"]] == [
        ({"section": "run", "name": "group"}, "=", "study")
    ]
    grouped = [p["config"] for p in _panels(saved) if p["viewType"] in ("Run History Line Plot", "Bar Chart")]
    assert grouped and all(
        c["groupBy"] == "jobType" and c["groupAgg"] == "mean" and c["groupArea"] == "stddev" for c in grouped
    )
    assert all(c["xAxis"] == records.ROUND for c in grouped if "xAxis" in c)
    tagged = spec.to_spec(spec.workspace(plan.project_view(keys, plan.RunFilter(tag="FedAvg")), "", "flsuite"))
    tag_filters = tagged["spec"]["spec"]["section"]["runSets"][0]["filters"]["filters"]
    assert [(f["key"], f["op"], f["value"]) for f in tag_filters] == [
        ({"section": "run", "name": "tags"}, "IN", ["FedAvg"])
    ]


def test_a_dry_run_without_runs_shows_every_declared_panel():
    saved = _round_trips(spec.workspace(plan.project_view(None), "", "flsuite"))
    named = metric_keys(saved)
    assert all(records.is_declared(k) for k in named)
    assert {records.FEDEGG_UPDATE_RATIO, *records.FEDCIR_LOSS_SHARES, records.TOTAL_BYTES_UP, "last5/acc_mean"} <= named
    assert [p["config"]["metricRegex"] for p in _panels(saved) if "metricRegex" in p["config"]] == ["^acc/.+"]


@pytest.mark.parametrize("sweep_file", SWEEPS, ids=lambda p: p.stem)
def test_every_sweep_file_has_its_view(sweep_file):
    sweep = plan.SweepFile.read(sweep_file)
    saved = _round_trips(spec.workspace(plan.sweep_view(sweep), "", sweep.project or "flsuite"))
    assert config_columns(saved) == list(sweep.parameters)
    named = metric_keys(saved) - {records.ROUND}
    assert named == {sweep.metric} and records.is_declared(sweep.metric)
    filters = saved["spec"]["spec"]["section"]["runSets"][0]["filters"]["filters"]
    assert [f["value"] for f in filters] == [sweep.name]


def test_the_sweep_metric_is_logged_once_per_round_and_the_replay_is_what_wandb_receives(tmp_path, monkeypatch):
    """Hyperband counts the logged values of a per-round metric: one per round (W&B offline, its log calls spied);
    a summary metric (last5/...) is never in the history. The keys read back from the run folder (`run_folder_keys`)
    are exactly the history keys W&B received."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    logged: list[dict] = []
    real_log = wandb.sdk.wandb_run.Run.log

    def spy(self, data, *a, **k):
        logged.append(dict(data))
        return real_log(self, data, *a, **k)

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", spy)
    head_federation(tmp_path, rounds=4, wandb=WandbConfig(enabled=True)).fit()
    history = [
        d
        for d in logged
        if records.ROUND in d and any(records.is_declared(k) for k in d if k != records.ROUND) and "partition" not in d
    ]
    for sweep in map(plan.SweepFile.read, SWEEPS):
        counts = Counter(d[records.ROUND] for d in history if sweep.metric in d)
        if sweep.per_round:
            assert counts == {r: 1 for r in range(1, 5)}, (sweep.name, counts)
        else:
            assert not counts and re.fullmatch(r"last\d+/.+", sweep.metric), sweep.name
    received = {k for d in history for k in d}
    assert received == set(run_folder_keys(tmp_path).history)


def test_compare_writes_the_report_spec_next_to_compare_md(runs, tmp_path, monkeypatch, capsys):
    from flsuite.cli import main

    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "report"
    assert main(["compare", str(runs["fedavg"]), str(runs["fedegg"]), "--out", str(out), "--wandb-report"]) == 0
    saved = json.loads((out / "wandb_report.json").read_text())
    assert (out / "compare.md").is_file() and saved["kind"] == "report"
    assert spec.to_spec(spec.from_spec(saved)) == saved
    blocks = saved["spec"]["spec"]["blocks"]
    markdown = [b["content"] for b in blocks if b["type"] == "markdown-block"]
    assert "| method |" in markdown[0] and "flsuite compare" in markdown[-1]
    runset = next(b for b in blocks if b["type"] == "panel-grid")["metadata"]["runSets"][0]
    assert [(f["op"], f["value"]) for f in runset["filters"]["filters"]] == [("IN", ["study"])]
    assert runset["grouping"] == [{"section": "run", "name": "jobType"}]
    named = metric_keys(saved)
    logged = folders_keys([runs["fedavg"], runs["fedegg"]])
    assert all(records.is_declared(k) for k in named) and named - {records.ROUND} <= logged.history | logged.summary


def test_the_cli_dry_run_writes_the_spec(runs, tmp_path, capsys):
    from flsuite.cli import main

    out = tmp_path / "view.json"
    assert (
        main(["dashboard", "--project", "p", "--group", "study", "--runs", str(runs["fedcir"]), "--dry-run", str(out)])
        == 0
    )
    saved = json.loads(out.read_text())
    assert saved["kind"] == "workspace" and saved["spec"]["project"] == "p"
    assert records.FEDCIR_LOSS_SHARES[0] in metric_keys(saved) and records.FEDEGG_GATE not in metric_keys(saved)
    assert main(["dashboard", "--sweep", str(SWEEPS[0]), "--dry-run", str(tmp_path / "sweep.json")]) == 0


def test_without_the_extra_the_command_names_it_before_any_work(tmp_path, monkeypatch, capsys):
    from flsuite.cli import main

    monkeypatch.setitem(sys.modules, "wandb_workspaces", None)  # `import wandb_workspaces` now raises ImportError
    out = tmp_path / "view.json"
    assert main(["dashboard", "--project", "p", "--runs", str(tmp_path / "nowhere"), "--dry-run", str(out)]) == 2
    err = capsys.readouterr().err
    assert 'pip install "flsuite[dashboard]"' in err and "nowhere" not in err and not out.exists()
    with pytest.raises(spec.MissingExtraError, match=re.escape('pip install "flsuite[dashboard]"')):
        spec.require_library()
