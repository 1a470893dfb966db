"""Two seeds (issue 38): the data seed draws the clients, the training seed the training; `seed` alone sets both."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from flsuite.compare.groups import group_by_experiment
from flsuite.compare.stats import group_stats, pair_key
from flsuite.data import cache_index
from flsuite.data.builtin import UCIDigitsDomains
from flsuite.data.validation import ValidationSplit
from flsuite.seeding import Seeds, config_seeds, resolve_seeds
from tests.helpers import SMALL_CONFIG, cnn_federation, head_federation, initial_weights, run_cli, write_config

DATA = UCIDigitsDomains(domains=("clean", "rotated"), clients_per_domain=3, beta=0.3, test_fraction=0.3)
VALIDATION = ValidationSplit(fraction=0.2)


def clients_of(data) -> list[tuple]:
    """Every client's training and validation samples and the test sets, as exact tensors (what the data seed draws)."""
    return [
        *[(c.domain, c.train.x, c.train.y) for c in data.clients],
        *[(d, s.x, s.y) for d, s in sorted(data.validation.items())],
        *[(d, s.x, s.y) for d, s in sorted(data.test.items())],
    ]


def same(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(
        x[0] == y[0] and all(torch.equal(p, q) for p, q in zip(x[1:], y[1:])) for x, y in zip(a, b)
    )


def raw(tmp_path, **seeds):
    return clients_of(cnn_federation(tmp_path, data=DATA, validation=VALIDATION, **seeds).raw_data())


def test_only_seed_draws_the_data_as_before_the_split(tmp_path):
    """With only `seed`, the clients are exactly what the single seed drew (the source's build and the validation
    split, both from `seed`), and they differ from another seed's (so the comparison can fail)."""
    before = clients_of(VALIDATION.apply(DATA.build(4), 4))
    assert same(raw(tmp_path, seed=4), before)
    assert not same(raw(tmp_path, seed=5), before)


def test_only_seed_equals_both_seeds_set_to_it_and_the_master_seed_then_draws_nothing(tmp_path):
    """A run with `seed: 7` and one with `seed: 99, data_seed: 7, train_seed: 7` write the same metrics.jsonl byte for
    byte: every stream comes from the data or the training seed, and `seed` alone sets both."""
    head_federation(tmp_path / "a", seed=7, validation=VALIDATION).fit()
    head_federation(tmp_path / "b", seed=99, data_seed=7, train_seed=7, validation=VALIDATION).fit()
    head_federation(tmp_path / "c", seed=99, validation=VALIDATION).fit()
    metrics = {k: (tmp_path / k / "metrics.jsonl").read_text() for k in "abc"}
    assert metrics["a"] == metrics["b"] != metrics["c"]


def test_a_fixed_data_seed_keeps_the_clients_and_a_training_seed_changes_the_training(tmp_path):
    fixed = raw(tmp_path, seed=0, data_seed=3)
    assert same(raw(tmp_path, seed=0, data_seed=3, train_seed=1), fixed)
    assert same(raw(tmp_path, seed=9, data_seed=3, train_seed=2), fixed)
    assert not same(raw(tmp_path, seed=0, data_seed=4), fixed)
    # The training draws: the initial weights and the clients' batches (hence the metrics) follow the training seed.
    runs = {t: head_federation(tmp_path / f"t{t}", seed=0, data_seed=3, train_seed=t) for t in (1, 2)}
    w1, w2 = (initial_weights(f) for f in runs.values())
    assert any(not torch.equal(w1[k], w2[k]) for k in w1)
    for f in runs.values():
        f.fit()
    partition = [(tmp_path / f"t{t}" / "partition.json").read_text() for t in runs]
    metrics = [(tmp_path / f"t{t}" / "metrics.jsonl").read_text() for t in runs]
    assert partition[0] == partition[1] and metrics[0] != metrics[1]


def test_a_fixed_training_seed_keeps_the_initial_weights_and_a_data_seed_changes_the_clients(tmp_path):
    a, b = (cnn_federation(tmp_path, data=DATA, seed=0, data_seed=d, train_seed=5) for d in (1, 2))
    wa, wb = initial_weights(a), initial_weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not same(clients_of(a.raw_data()), clients_of(b.raw_data()))
    settings = a.settings()
    assert (settings.seed, settings.data_seed, settings.seeds) == (5, 1, Seeds(1, 5))


def test_the_seeds_are_recorded_in_the_run_folder(tmp_path):
    head_federation(None, output_dir=tmp_path, name="x", seed=2, train_seed=6, rounds=1).fit()
    (run_dir,) = (tmp_path / "x").iterdir()
    env = json.loads((run_dir / "environment.json").read_text())
    assert (env["seed"], env["data_seed"], env["train_seed"]) == (2, 2, 6)
    assert "-seed2-train6-" in run_dir.name
    head_federation(None, output_dir=tmp_path, name="y", seed=2, rounds=1).fit()
    (plain,) = (tmp_path / "y").iterdir()
    assert "-seed2-" in plain.name and "train" not in plain.name and "data" not in plain.name


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--data_seed", "-1"), ("--train_seed", str(2**32)), ("--seed", "-3")],
)
def test_a_bad_seed_is_refused_before_any_work(tmp_path, capsys, flag, value):
    cfg = write_config(tmp_path / "c.yaml", SMALL_CONFIG | {"output_dir": str(tmp_path / "runs")})
    code, _, err = run_cli(["fit", "--config", str(cfg), flag, value], capsys)
    key = flag.removeprefix("--")
    assert code != 0 and f"{key} must be an integer in [0, 2**32)" in err and value in err
    assert not (tmp_path / "runs").exists()


def test_a_seed_that_is_not_an_integer_is_refused_by_the_parser(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", SMALL_CONFIG | {"output_dir": str(tmp_path / "runs")})
    code, _, err = run_cli(["fit", "--config", str(cfg), "--train_seed", "abc"], capsys)
    assert code != 0 and "train_seed" in err
    assert not (tmp_path / "runs").exists()


def test_resolve_seeds():
    assert resolve_seeds(3) == Seeds(3, 3)
    assert resolve_seeds(3, data_seed=0) == Seeds(0, 3)
    assert resolve_seeds(3, train_seed=2**32 - 1) == Seeds(3, 2**32 - 1)
    with pytest.raises(ValueError, match=r"data_seed must be an integer in \[0, 2\*\*32\).*got True"):
        resolve_seeds(3, data_seed=True)  # type: ignore[arg-type]


def test_readers_pair_and_group_runs_by_their_effective_seeds():
    """A run folder from before the split (only `seed`) pairs with a new run of the same data and training seeds; a
    grid of training seeds over one data seed is one experiment (one group) with as many seeds as pairs."""
    old, new = {"seed": 1}, {"seed": 1, "data_seed": None, "train_seed": None}
    assert config_seeds(old) == config_seeds(new) == Seeds(1, 1)
    assert pair_key(old) == pair_key(new) == pair_key({"seed": 8, "data_seed": 1, "train_seed": 1})
    assert pair_key({"seed": 1, "data_seed": None, "train_seed": 2}) != pair_key(old)
    assert pair_key({"rounds": 3}) is None


def test_compare_groups_a_grid_of_training_seeds_as_one_experiment(tmp_path):
    from flsuite.compare.runs import load_run
    from tests.compare.test_compare import make_run

    base = {"method": {"class_path": "flsuite.methods.fedavg.FedAvg"}, "rounds": 5, "last_k": 2}
    grid = [(0, None), (0, 1), (0, 2), (1, None)]
    for i, (seed, train) in enumerate(grid):
        make_run(
            tmp_path / f"r{i}", [{"a": 50.0 + i, "b": 60.0}] * 5, 2, config=base | {"seed": seed, "train_seed": train}
        )
    groups = group_by_experiment(sorted(tmp_path.iterdir()))
    assert list(groups) == ["FedAvg"] and len(groups["FedAvg"]) == 4
    runs = [load_run(p) for p in groups["FedAvg"]]
    assert group_stats("FedAvg", runs).seeds() == "4"
    assert group_stats("FedAvg", [*runs[:2], runs[0]]).seeds() == "2 (3 runs)"


def test_the_feature_index_keys_a_build_by_its_data_seed():
    """`flsuite features` reports a build from the index by its data seed: a config without `data_seed` keeps the key
    it had before the option existed, the training seed does not enter it, and a data seed does."""
    base = yaml.safe_load(yaml.safe_dump({"data": {"class_path": "X"}, "validation": {"fraction": 0.0}}))
    plain = cache_index.request_key(base | {"seed": 1})
    assert cache_index.request_key(base | {"seed": 1, "data_seed": None, "train_seed": 4}) == plain
    assert cache_index.request_key(base | {"seed": 0, "data_seed": 1}) == plain
    assert cache_index.request_key(base | {"seed": 1, "data_seed": 2}) != plain


@pytest.mark.slow
def test_a_study_grid_of_data_and_training_seeds(tmp_path, monkeypatch, capsys):
    """experiments/study.py --seeds 0 --train_seeds 1 2: one data seed's clients trained with two training seeds, in
    `seed0-train1` and `seed0-train2`; the same clients (partition.json), other training (metrics.jsonl); one table
    row over 2 seeds. A seed outside [0, 2**32) stops the study before any run. The driver's `flsuite` commands run in
    this process (`study_in_this_process`: the folders and seeds are the driver's doing, not its processes')."""
    import sys

    from tests.compare.test_study_reuse import BASE, ROOT
    from tests.helpers import load_experiment, study_in_this_process

    study = load_experiment("study")
    pool = study_in_this_process(study, monkeypatch)
    assert [str(s) for s in study.run_seeds([0, 3], [1, 2])] == ["0-train1", "0-train2", "3-train1", "3-train2"]
    assert study.run_seeds([4], None) == [study.RunSeed(4)] and str(study.RunSeed(4)) == "4"
    assert study.common_args(study.RunSeed(0, 2), ["--rounds", "1"])[:4] == ["--seed", "0", "--train_seed", "2"]
    assert study.common_args(0, [])[:3] == ["--seed", "0", "--progress"]
    base = write_config(tmp_path / "base.yaml", BASE)
    resolved = yaml.safe_load(study.requested_config(base, "", study.RunSeed(0, 2), tmp_path / "r", []))
    assert (resolved["seed"], resolved["data_seed"], resolved["train_seed"]) == (0, None, 2)

    runs = tmp_path / "runs"
    argv = [
        "study.py",
        "--name",
        "s",
        "--base",
        str(base),
        "--variant",
        "base=",
        "--seeds",
        "0",
        "--workers",
        "1",
        "--runs",
        str(runs),
    ]
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [*argv, "--train_seeds", "1", str(2**32)])
    with pytest.raises(SystemExit, match=r"--seeds and --train_seeds must be integers in \[0, 2\*\*32\).*4294967296"):
        study.main()
    assert not runs.exists()
    monkeypatch.setattr(sys, "argv", [*argv, "--train_seeds", "1", "2", "--out", str(tmp_path / "t.md")])
    study.main()
    assert pool.runs == 2
    folders = [runs / "s" / "base" / f"seed0-train{t}" for t in (1, 2)]
    envs = [json.loads((f / "environment.json").read_text()) for f in folders]
    assert [(e["data_seed"], e["train_seed"]) for e in envs] == [(0, 1), (0, 2)]
    assert (folders[0] / "partition.json").read_text() == (folders[1] / "partition.json").read_text()
    assert (folders[0] / "metrics.jsonl").read_text() != (folders[1] / "metrics.jsonl").read_text()
    row = next(line for line in (tmp_path / "t.md").read_text().splitlines() if line.startswith("| base |"))
    assert row.rstrip(" |").endswith("| 2")


def test_server_held_data_follows_the_data_seed(tmp_path):
    """Server-held public data (`ServerFinetune`'s `PublicData`; FedEGG's guiding set alike) is data: built from the
    data seed, the same whatever the training seed."""
    from types import SimpleNamespace

    from flsuite.data.builtin import GaussianFeatures
    from flsuite.federation.server import PublicData, ServerFinetune

    def public(**seeds) -> tuple:
        step = ServerFinetune(
            PublicData(
                GaussianFeatures(dim=8, num_classes=3, num_domains=1, clients_per_domain=1, samples_per_client=20)
            )
        )
        step.prepare(SimpleNamespace(settings=head_federation(tmp_path, **seeds).settings()))
        assert step._split is not None
        return step._split.x, step._split.y

    fixed = public(seed=0, data_seed=3, train_seed=1)
    assert all(torch.equal(a, b) for a, b in zip(fixed, public(seed=5, data_seed=3, train_seed=2)))
    assert not torch.equal(fixed[0], public(seed=0, data_seed=4, train_seed=1)[0])
    assert all(torch.equal(a, b) for a, b in zip(public(seed=3), fixed))  # only `seed`: the data seed is `seed`


def test_a_seed_folders_label_is_a_key_that_pairs_and_sorts_by_seed():
    from flsuite.seeding import label_key

    labels = [Seeds(d, t).label(s) for s, d, t in ((10, 10, 10), (2, 2, 2), (2, 2, 1), (0, 5, 0))]
    assert labels == ["seed10", "seed2", "seed2-train1", "seed0-data5"]
    assert sorted(labels, key=label_key) == ["seed0-data5", "seed2", "seed2-train1", "seed10"]
    assert label_key("seed2-train1") == (2, "train1") != label_key("seed2")


def test_seed_torch_seeds_the_global_generator_as_torch_does_and_every_accelerator_where_there_is_one(monkeypatch):
    from flsuite import seeding

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2**40 + 7)
        expected = torch.rand(5), torch.randn(3)
        seeding.seed_torch(2**40 + 7)
        assert all(torch.equal(a, b) for a, b in zip(expected, (torch.rand(5), torch.randn(3)), strict=True))

        calls: list[int] = []
        monkeypatch.setattr(torch, "manual_seed", calls.append)
        monkeypatch.setattr(seeding, "_has_accelerator", lambda: False)
        seeding.seed_torch(3)  # no accelerator: the CPU's generator only, no lazy seeding queued for absent devices
        monkeypatch.setattr(seeding, "_has_accelerator", lambda: True)
        seeding.seed_torch(4)  # an accelerator: torch's own call, which seeds its generators too
        assert calls == [4]
