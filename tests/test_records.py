"""The record schema (flsuite/records.py): what phases write is what metrics, tracking, compare and sweep read."""

from __future__ import annotations

import json

import pytest

from flsuite import records
from flsuite.metrics import final_summary
from tests.helpers import head_federation


def test_a_prefixed_record_round_trips_to_the_plain_names():
    metrics = {"acc_mean": 50.0, "acc/a": 40.0}
    prefixed = records.record(3, metrics, records.traffic(up=12), phase="experts/expert0", prefix="expert0/")
    assert prefixed == {
        "round": 3,
        "phase": "experts/expert0",
        "expert0/acc_mean": 50.0,
        "expert0/acc/a": 40.0,
        "expert0/bytes_up": 12,
    }
    assert records.without_prefix(prefixed, "expert0/") == {
        "round": 3,
        "phase": "experts/expert0",
        **metrics,
        "bytes_up": 12,
    }


def test_the_record_builder_keeps_the_order_of_its_parts_and_names_the_phase_only_when_given():
    built = records.record(2, {"a": 1}, records.traffic(up=5, down=7), {"z": 0})
    assert list(built.items()) == [("round", 2), ("a", 1), ("bytes_down", 7), ("bytes_up", 5), ("z", 0)]
    assert records.record(0, phase="cluster") == {"round": 0, "phase": "cluster"} and records.traffic() == {}


def test_the_summary_prefix_follows_last_k_and_an_unfinished_summary_is_named():
    history = [{"round": r, "acc_mean": float(r), "acc/a": float(r)} for r in (1, 2, 3)]
    summary = final_summary(history, last_k=2)
    assert records.summary_prefix(summary) == records.last_k_prefix(2) == "last2/"
    assert summary["last2/acc_mean"] == 2.5 and summary[records.BEST_ROUND] == 3
    with pytest.raises(KeyError, match="no last<k>/acc_mean"):
        records.summary_prefix({"best/acc_mean": 1.0})


def test_accuracy_keys_are_the_evaluation_ones():
    assert [
        k
        for k in ("acc/clean", "acc_mean", "acc_std_sample", "train_loss", "bytes_up", "server/x/acc")
        if records.is_accuracy_key(k)
    ] == [
        "acc/clean",
        "acc_mean",
        "acc_std_sample",
    ]
    assert all(records.PER_ROUND.fullmatch(k) for k in ("acc/clean", "acc_mean", "acc_std", "train_loss"))
    assert not records.PER_ROUND.fullmatch("last5/acc_mean")


def test_query_totals_add_the_queries_and_the_setup_stages_bytes():
    summary = {
        "query/ggeur/stats/bytes_up": 10,
        "query/ggeur/stats/bytes_down": 3,
        "query/ggeur/stats/calls": 1,
        "last5/acc_mean": 1.0,
    }
    setup = {"setup/ggeur/bytes_up": 5, "setup/ggeur/seconds": 2.0}
    assert records.query_totals(summary, setup) == {"bytes_up": 15.0, "bytes_down": 3.0}


def test_a_run_writes_the_keys_the_schema_names(tmp_path):
    head_federation(tmp_path, rounds=2).fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    schema = {
        records.ROUND,
        records.CLIENTS,
        records.CLIENTS_FAILED,
        records.CLIENTS_REJECTED,
        records.TRAIN_LOSS,
        records.BYTES_DOWN,
        records.BYTES_UP,
        records.CLIENT_LOSS,
        records.CLIENT_STEPS,
        records.ACC_MEAN,
        records.ACC_STD,
    }
    assert all(schema <= set(r) for r in rows) and all(
        any(records.is_accuracy_key(k) and k.startswith(records.ACC_PREFIX) for k in r) for r in rows
    )
    timings = [json.loads(line) for line in (tmp_path / "timings.jsonl").read_text().splitlines()]
    assert all(
        {records.ROUND, records.ROUND_SECONDS, records.CLIENTS_SECONDS, records.EVAL_SECONDS} <= set(t) for t in timings
    )
