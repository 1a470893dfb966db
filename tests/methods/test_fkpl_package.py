"""FKPL as a package (issue 34): the stage settings and their checks, phases that hold their stage's settings only,
the cost table from the stages' typed costs, and the old module paths."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path

import pytest
from jsonargparse import ArgumentParser
from jsonargparse._util import get_import_path

from flsuite import records
from flsuite.methods import MOVED
from flsuite.methods.fkpl import (
    FKPL,
    calibrate,
    cluster,
    clustering,
    costs,
    experts,
    head,
    model,
    prototypes,
    settings,
    subspace,
)
from flsuite.methods.fkpl.costs import CalibrationCost, ClusterCost, CostTable, EncoderCost, ExpertCost
from flsuite.methods.fkpl.settings import CalibrationSettings, ClusterSettings, ExpertSettings
from flsuite.models.heads import ModelSpec

STAGES = (ClusterSettings, ExpertSettings, CalibrationSettings)

#: The names each old module defined (at cc8ede9, before the package) that still exist, and where they are now.
OLD_NAMES = {
    "flsuite.methods.fkpl_stages": {clustering: ["ClusterClients"], experts: ["TrainExperts"], costs: ["scalars"]},
    "flsuite.methods.fkpl_calibrate": {
        calibrate: ["Calibrate"],
        prototypes: ["PrototypeQuery", "VirtualFeatureQuery", "unpack_prototypes", "domain_prototypes"],
        head: ["fit_head", "FederatedHead"],
    },
    "flsuite.methods.fkpl_cluster": {
        settings: ["Angle", "Linkage"],
        cluster: [
            "principal_angle",
            "angle_matrix",
            "cluster",
            "weighted_linkage",
            "members",
            "purity",
            "threshold_scan",
            "default_scan",
            "plot_angles",
        ],
    },
    "flsuite.methods.fkpl_model": {
        model: ["head_keys", "encoder_weights", "ConcatModel", "SeededInit", "ConcatExperts", "encode"]
    },
    "flsuite.methods.fkpl_subspace": {
        settings: ["ClassBudget"],
        subspace: [
            "CROP_PADDING",
            "subspace_basis",
            "round_to_budget",
            "class_budget",
            "stage0_inputs",
            "SubspaceBasis",
            "client_basis",
            "client_bases",
        ],
    },
}


# ---- settings ---------------------------------------------------------------------------------------------------
def test_every_option_of_fkpl_belongs_to_exactly_one_stage_with_the_same_default():
    options = {name: p.default for name, p in inspect.signature(FKPL).parameters.items()}
    keys = [k for stage in STAGES for k in stage.keys()]
    assert sorted(keys) == sorted(options) and len(keys) == len(set(keys)) == 25
    built = FKPL()
    for stage, attr in zip(STAGES, ("stage0", "stage1", "stage2"), strict=True):
        assert getattr(built, attr) == stage() and all(getattr(stage(), k) == options[k] for k in stage.keys())
    given = FKPL(threshold=2.0, expert_rounds=3, partner="all", stage0_size=32)
    assert (given.stage0.threshold, given.stage1.expert_rounds, given.stage2.partner, given.stage0.stage0_size) == (
        2.0,
        3,
        "all",
        32,
    )


BAD = [
    ({"threshold": -1.0}, "Stage 0", "threshold must be >= 0, got -1.0"),
    ({"basis": 0}, "Stage 0", "basis must be >= 1, got 0"),
    ({"angle": "cosine"}, "Stage 0", "angle must be 'exact' or 'pacfl', got 'cosine'"),
    ({"class_budget": "equal"}, "Stage 0", "class_budget must be 'floor' or 'counts', got 'equal'"),
    ({"linkage": "single"}, "Stage 0", "linkage must be 'average' or 'weighted', got 'single'"),
    ({"stage0_size": 0}, "Stage 0", "stage0_size must be >= 1 or null, got 0"),
    ({"assignment": "random"}, "Stage 0", "assignment must be 'subspace', 'single' or 'domains', got 'random'"),
    ({"expert_rounds": 0}, "Stage I", "expert_rounds must be >= 1 or null, got 0"),
    ({"expert_init": "own"}, "Stage I", "expert_init must be 'shared' or 'independent', got 'own'"),
    ({"head": "client"}, "Stage II", "head must be 'server' or 'federated', got 'client'"),
    ({"a": 0.7, "b": 0.5}, "Stage II", "a and b must satisfy 0 <= a <= b <= 1, got a = 0.7, b = 0.5"),
    ({"lam_on": "both"}, "Stage II", "lam_on must be 'feature' or 'prototype', got 'both'"),
    ({"lam_decimals": -1}, "Stage II", "lam_decimals must be an integer >= 0 or null, got -1"),
    ({"partner": "any"}, "Stage II", "partner must be 'one', 'other' or 'all', got 'any' ('any' is now 'one')"),
    ({"head_epochs": 0}, "Stage II", "head_epochs must be >= 1, got 0"),
    ({"head_batch_size": 0}, "Stage II", "head_batch_size must be >= 1, got 0"),
    ({"virtual_per_sample": 0}, "Stage II", "virtual_per_sample must be >= 1, got 0"),
    ({"head_lr": 0.0}, "Stage II", "head_lr must be > 0, got 0.0"),
    ({"head_rounds": 0}, "Stage II", "head_rounds must be >= 1 or null, got 0"),
]


@pytest.mark.parametrize("given, stage, message", BAD, ids=[next(iter(b[0])) for b in BAD])
def test_each_check_names_the_stage_the_key_the_value_and_what_was_expected(given, stage, message):
    with pytest.raises(ValueError) as err:
        FKPL(**given)
    assert str(err.value) == f"FKPL {stage} settings: {message}"
    owner = next(s for s in STAGES if set(given) <= set(s.keys()))
    with pytest.raises(ValueError, match="^FKPL"):
        owner(**given)  # checked where the settings are built, not by FKPL


def test_a_stage_names_every_bad_value_at_once():
    with pytest.raises(
        ValueError, match=r"^FKPL Stage 0 settings: threshold must be >= 0, got -1; basis must be >= 1, got 0$"
    ):
        ClusterSettings(threshold=-1, basis=0)


# ---- phases ------------------------------------------------------------------------------------------------------
def test_each_phase_holds_its_stages_settings_and_never_the_method():
    fkpl = FKPL(threshold=2.0, expert_init="independent", head="federated")
    phases = fkpl.protocol()
    assert [p.name for p in phases] == list(FKPL.names)
    assert [p.settings for p in phases] == [fkpl.stage0, fkpl.stage1, fkpl.stage2]
    assert not [(p.name, k) for p in phases for k, v in vars(p).items() if isinstance(v, FKPL)]


def test_no_function_of_the_package_takes_the_method_or_untyped_settings():
    """No `fkpl` parameter and no parameter named `settings` that is not one of the three stage settings."""
    package = Path(settings.__file__).parent
    bad = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in [*node.args.args, *node.args.kwonlyargs]:
                    kind = ast.unparse(arg.annotation) if arg.annotation else None
                    if arg.arg == "fkpl" or (arg.arg == "settings" and kind not in {s.__name__ for s in STAGES}):
                        bad.append(f"{path.name}:{node.lineno} {node.name}({arg.arg}: {kind})")
    assert bad == []


# ---- the cost table ----------------------------------------------------------------------------------------------
def _table(calibration: bool = True) -> CostTable:
    stage2 = CalibrationCost(10, 11, 12, 13, 14, 15, 0.1, 0.2, 0.3) if calibration else None
    return CostTable(ClusterCost(1, 2, 0.5, 0.6), ExpertCost(3, 4, [5, 6], 2, 0.7), EncoderCost(8, 9), stage2)


def test_the_cost_table_puts_counts_in_the_record_and_times_in_the_timing_under_the_schemas_names():
    table = _table()
    assert list(table.counts().items()) == [
        (records.FKPL_STAGE0_BYTES_UP, 1),
        (records.FKPL_STAGE0_SCALARS_UP, 2),
        (records.FKPL_STAGE1_BYTES_UP, 3),
        (records.FKPL_STAGE1_BYTES_DOWN, 4),
        (records.FKPL_STAGE1_SCALARS_PER_EXPERT, [5, 6]),
        (records.FKPL_STAGE1_ROUNDS, 2),
        (records.FKPL_ENCODER_BYTES_DOWN, 8),
        (records.FKPL_ENCODER_SCALARS_DOWN, 9),
        (records.FKPL_PROTOTYPE_SCALARS_UP, 10),
        (records.FKPL_DOMAIN_PROTOTYPE_SCALARS_DOWN, 11),
        (records.FKPL_VIRTUAL_SCALARS_UP, 12),
        (records.FKPL_NUM_VIRTUAL, 13),
        (records.FKPL_STAGE2_BYTES_UP, 14),
        (records.FKPL_STAGE2_BYTES_DOWN, 15),
    ]  # stage by stage, as the record has always listed them
    assert list(table.times()) == [
        records.FKPL_STAGE0_PREPROCESS_SECONDS,
        records.FKPL_STAGE0_CLUSTER_SECONDS,
        records.FKPL_STAGE1_SECONDS,
        records.FKPL_PROTOTYPES_SECONDS,
        records.FKPL_VIRTUAL_SECONDS,
        records.FKPL_HEAD_FIT_SECONDS,
    ]
    setup = table.setup()
    assert list(setup)[:4] == [
        f"fkpl/{k}"
        for k in ("stage0/bytes_up", "stage0/scalars_up", "stage0/time/preprocess_s", "stage0/time/cluster_s")
    ]
    assert set(setup) == {f"fkpl/{k}" for k in [*table.counts(), *table.times()]}
    assert {*records.FKPL_STAGE_BYTES_UP, *records.FKPL_STAGE_BYTES_DOWN, *records.FKPL_STAGE_SECONDS} <= set(setup)
    record = records.record(1, {"acc_mean": 50.0}, table.counts(), phase="calibrate")
    assert costs.cost_summary(record) == {f"fkpl/{k}": v for k, v in table.counts().items()}
    assert list(_table(calibration=False).setup())[-2:] == [
        "fkpl/stage2/encoder_bytes_down",
        "fkpl/stage2/encoder_scalars_down",
    ]


def test_stage0s_cost_round_trips_through_its_record_and_timing():
    cost = ClusterCost(96, 24, 0.25, 0.5)
    record = records.record(0, {records.FKPL_NUM_CLUSTERS: 2}, cost.record(), phase="cluster")
    timing = records.record(0, cost.timing(), phase="cluster")
    assert record == {"round": 0, "phase": "cluster", "cluster/num_clusters": 2, "bytes_up": 96, "scalars_up": 24}
    assert ClusterCost.read(record, timing) == cost


def test_stage1s_cost_sums_the_experts_rounds_under_the_plain_names():
    rounds = [{"round": r, "bytes_up": 10 * r, "bytes_down": r} for r in (1, 2)] * 2
    cost = ExpertCost.of(rounds, [{"round": 1, records.ROUND_SECONDS: 0.5}] * 4, [])
    assert (cost.bytes_up, cost.bytes_down, cost.rounds, cost.seconds, cost.scalars_per_expert) == (60, 6, 2, 2.0, [])


# ---- the old module paths ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_each_old_module_path_resolves_to_the_same_objects_and_warns(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"^{old} is now flsuite\.methods\.fkpl\."):
        module = importlib.import_module(old)
    for home, names in OLD_NAMES[old].items():
        assert home.__name__ in MOVED[old]
        for name in names:
            assert getattr(module, name) is getattr(home, name), f"{old}.{name}"
    with pytest.raises(AttributeError, match="has no attribute 'FKPLPhase'"):
        module.FKPLPhase  # noqa: B018 - the old phases' base took the method object: gone


def test_the_old_methods_base_path_is_the_engines_contract_and_warns(monkeypatch):
    """methods/base.py re-exported the engine's contract (issue 34: no re-export shims); its path is an alias now."""
    from flsuite.federation import method

    monkeypatch.delitem(sys.modules, "flsuite.methods.base", raising=False)
    with pytest.warns(DeprecationWarning, match=r"^flsuite\.methods\.base is now flsuite\.federation\.method;"):
        module = importlib.import_module("flsuite.methods.base")
    assert [getattr(module, n) for n in ("ClientModule", "HyperParameters", "Method")] == [
        method.ClientModule,
        method.HyperParameters,
        method.Method,
    ]


def test_fkpls_class_path_is_the_packages_and_configs_may_name_an_old_path():
    assert get_import_path(FKPL) == "flsuite.methods.fkpl.FKPL" == f"{FKPL.__module__}.{FKPL.__name__}"
    assert set(MOVED) == set(OLD_NAMES) | {"flsuite.methods.base"}  # every alias tested here or below
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--model", type=ModelSpec)
    with pytest.warns(DeprecationWarning):  # a config that names an old module path (warned where it is imported)
        sys.modules.pop("flsuite.methods.fkpl_model", None)
        cfg = parser.parse_args(
            [
                "--model",
                "flsuite.methods.fkpl_model.ConcatExperts",
                "--model.expert",
                "flsuite.models.heads.MLP",
                "--model.num_experts",
                "2",
            ]
        )
    assert type(parser.instantiate_classes(cfg).model) is model.ConcatExperts
