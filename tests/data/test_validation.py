"""The validation split (`validation.fraction`): counts by hand, disjoint from training, deterministic, stratified as
stated, never the global RNG, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flsuite.data.base import ClientData, DataError, FederatedData, Split
from flsuite.data.validation import ValidationSplit, held_out_per_class


def split(labels: list[int], start: int) -> Split:
    """Samples whose single feature is a unique id (start, start + 1, ...), so each can be traced."""
    return Split(torch.arange(start, start + len(labels), dtype=torch.float32)[:, None], torch.tensor(labels))


def federation() -> FederatedData:
    """Client 0 (domain a): classes 0/1/2 × 11/6/3; client 1 (a): 8/1/1; client 2 (b): class 2 × 8."""
    labels = [[0] * 11 + [1] * 6 + [2] * 3, [0] * 8 + [1, 2], [2] * 8]
    clients = [ClientData(k, d, split(y, 100 * k)) for k, (d, y) in enumerate(zip("aab", labels))]
    return FederatedData(clients, {"a": split([0, 1], 900), "b": split([2], 950)}, num_classes=3)


def ids(s: Split) -> list[int]:
    return [int(v) for v in s.x[:, 0]]


def test_counts_by_hand_disjoint_and_pooled_per_domain():
    data = federation()
    # client 0: n=20, m=round(0.25·20)=5; shares 5·(11,6,3)/20 = 2.75, 1.5, 0.75 -> floors 2,1,0 (3), the 2 left go to
    # the largest remainders (0.75, 0.75: classes 0 and 2) -> 3, 1, 1.
    # client 1: n=10, m=round_half_up(2.5)=3; 3·(8,1,1)/10 = 2.4, 0.3, 0.3 -> 2,0,0 and the 1 left to class 0 -> 3,0,0:
    # its classes 1 and 2 (1 sample each, fewer than n/m) give none. client 2: m=2, all of class 2.
    out = ValidationSplit(0.25).apply(data, seed=0)
    assert [len(c.train) for c in out.clients] == [15, 7, 6]
    assert {d: len(s) for d, s in out.validation.items()} == {"a": 8, "b": 2}
    val_ids = set(ids(out.validation["a"])) | set(ids(out.validation["b"]))
    for before, after in zip(data.clients, out.clients):
        train_ids, own = ids(after.train), set(ids(before.train))
        assert not set(train_ids) & val_ids  # disjoint
        assert set(train_ids) | (val_ids & own) == own  # together: the client's whole split
        assert train_ids == sorted(train_ids)  # the rest kept in its original order
        kept = np.bincount(after.train.y.numpy(), minlength=3)
        assert (np.bincount(before.train.y.numpy(), minlength=3) - kept).tolist() == {
            0: [3, 1, 1],
            1: [3, 0, 0],
            2: [0, 0, 2],
        }[before.client_id]
    # pooled per domain: client 0's held-out samples, then client 1's, labels as counted
    assert np.bincount(out.validation["a"].y.numpy(), minlength=3).tolist() == [6, 1, 1]
    assert out.partition_stats()["validation"] == {"a": 8, "b": 2}
    assert "validation" not in data.partition_stats() and data.validation == {}


def test_deterministic_seeded_and_not_the_global_rng():
    data = federation()
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()
    first, again = ValidationSplit(0.25).apply(data, seed=3), ValidationSplit(0.25).apply(data, seed=3)
    assert torch.equal(torch.get_rng_state(), torch_state) and np.array_equal(np.random.get_state()[1], np_state[1])
    assert all(ids(a.train) == ids(b.train) for a, b in zip(first.clients, again.clients))
    assert ids(first.validation["a"]) == ids(again.validation["a"])
    others = {tuple(ids(ValidationSplit(0.25).apply(data, seed=s).validation["a"])) for s in range(6)}
    assert len(others) > 1  # which samples: drawn from the seed


def test_stratified_shares_are_proportional():
    labels = [0] * 50 + [1] * 30 + [2] * 20
    client = FederatedData([ClientData(0, "a", split(labels, 0))], {"a": split([0], 900)}, num_classes=3)
    for seed in range(5):  # m = 10 of 100: exactly 5, 3, 2 whatever the draw
        assert np.bincount(ValidationSplit(0.1).apply(client, seed).validation["a"].y.numpy()).tolist() == [5, 3, 2]
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1, 2, 3], [50, 30, 20, 0])
    assert held_out_per_class(labels, 0.1, 4, rng).tolist() == [5, 3, 2, 0]  # m = 10, exactly proportional
    labels = np.repeat([0, 1, 2], [7, 7, 7])  # m = round(2.1) = 2 over three equal classes: two of them, seeded
    draws = {tuple(held_out_per_class(labels, 0.1, 3, np.random.default_rng(s)).tolist()) for s in range(20)}
    assert all(sum(d) == 2 and max(d) == 1 for d in draws) and len(draws) > 1  # ties not always to the lowest label


def test_fraction_zero_is_the_data_itself():
    data = federation()
    assert ValidationSplit().apply(data, seed=0) is data and ValidationSplit(0.0).apply(data, seed=0) is data


@pytest.mark.parametrize("fraction", [1.0, -0.1, 1.5, float("nan")])
def test_fraction_outside_zero_one_names_the_key(fraction):
    with pytest.raises(ValueError, match=r"validation\.fraction must be in \[0, 1\), got"):
        ValidationSplit(fraction)


def test_a_client_left_without_training_samples_is_named_with_its_counts():
    data = federation()
    tiny = FederatedData([*data.clients, ClientData(3, "b", split([1], 500))], data.test, num_classes=3)
    with pytest.raises(
        DataError, match=r"validation\.fraction=0\.5 holds out 1 of client 3's 1 training samples \(domain 'b'\)"
    ):
        ValidationSplit(0.5).apply(tiny, seed=0)
    ValidationSplit(0.4).apply(tiny, seed=0)  # round(0.4) = 0: client 3 keeps its sample
