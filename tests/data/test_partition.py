"""Partition protocols: determinism, disjointness/completeness, label skew following β, LDS coefficients, errors."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pytest

from flsuite.data.base import DataError
from flsuite.data.index_splits import dirichlet_partition
from flsuite.data.partition import (
    ClientIndices,
    Dirichlet,
    DomainSkew,
    LabelDomainSkew,
    Partitioner,
    drop_empty_clients,
)
from flsuite.data.partition_reference import IID, Centralised

C = 10


def _domain_labels(n: int, seed: int) -> np.ndarray:
    """`n` labels over C classes with uneven class sizes (every class at least 12 samples)."""
    rng = np.random.default_rng(seed)
    counts = 12 + rng.multinomial(n - 12 * C, rng.dirichlet(np.ones(C)))
    return rng.permutation(np.repeat(np.arange(C), counts))


LABELS = {"mnist": _domain_labels(300, 1), "svhn": _domain_labels(420, 2), "usps": _domain_labels(250, 3)}
ONE = {"cifar": _domain_labels(400, 4)}


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _check_valid(clients: list[ClientIndices], labels: dict[str, np.ndarray]) -> None:
    """Indices are sorted int64, in range, and no index is held by two clients of the same domain."""
    for domain, y in labels.items():
        held = [c.indices for c in clients if c.domain == domain]
        for idx in held:
            assert idx.dtype == np.int64 and idx.ndim == 1
            assert np.all(np.diff(idx) > 0), "indices must be sorted and distinct"
            assert len(idx) == 0 or (idx.min() >= 0 and idx.max() < len(y))
        joined = np.concatenate(held) if held else np.array([], dtype=np.int64)
        assert len(np.unique(joined)) == len(joined), f"an index of {domain} is held by two clients"
    assert {c.domain for c in clients} <= set(labels)


def _check_complete(clients: list[ClientIndices], labels: dict[str, np.ndarray]) -> None:
    _check_valid(clients, labels)
    for domain, y in labels.items():
        joined = np.sort(np.concatenate([c.indices for c in clients if c.domain == domain]))
        np.testing.assert_array_equal(joined, np.arange(len(y)))


def _mean_tv(clients: list[ClientIndices], labels: dict[str, np.ndarray]) -> float:
    """Mean over non-empty clients of the total-variation distance between the client's label distribution and the
    label distribution of the data handed out in its domain."""
    tvs = []
    for domain, y in labels.items():
        mine = [c for c in clients if c.domain == domain and len(c)]
        pooled = np.bincount(y[np.concatenate([c.indices for c in mine])], minlength=C).astype(float)
        pooled /= pooled.sum()
        for c in mine:
            p = np.bincount(y[c.indices], minlength=C) / len(c)
            tvs.append(0.5 * np.abs(p - pooled).sum())
    return float(np.mean(tvs))


# (name, partitioner factory, labels, random?)
CASES: list[tuple[str, Callable[[], Partitioner], dict[str, np.ndarray], bool]] = [
    ("iid", lambda: IID(num_clients=7), ONE, True),
    ("dirichlet", lambda: Dirichlet(num_clients=6, beta=0.5), ONE, True),
    ("dirichlet_min", lambda: Dirichlet(num_clients=4, beta=0.1, min_per_class=1), ONE, True),
    ("domain_skew", lambda: DomainSkew(fraction=0.3, clients_per_domain=2), LABELS, True),
    (
        "domain_skew_beta",
        lambda: DomainSkew(clients_per_domain={"mnist": 2, "svhn": 4, "usps": 1}, beta=0.3),
        LABELS,
        True,
    ),
    ("lds", lambda: LabelDomainSkew(beta=0.5), LABELS, True),
    ("centralised", lambda: Centralised(), ONE, False),
]


@pytest.mark.parametrize("name,make,labels,random", CASES, ids=[c[0] for c in CASES])
def test_deterministic_given_rng_and_valid(
    name: str, make: Callable[[], Partitioner], labels: dict, random: bool
) -> None:
    a = make().split(labels, C, _rng(0))
    b = make().split(labels, C, _rng(0))
    other = make().split(labels, C, _rng(1))
    _check_valid(a, labels)
    assert [c.domain for c in a] == [c.domain for c in b]
    assert all(np.array_equal(x.indices, y.indices) for x, y in zip(a, b, strict=True))
    differs = [c.domain for c in a] != [c.domain for c in other] or any(
        not np.array_equal(x.indices, y.indices) for x, y in zip(a, other, strict=True)
    )
    assert differs == random


def test_iid_complete_and_near_equal() -> None:
    clients = IID(num_clients=7).split(ONE, C, _rng(3))
    _check_complete(clients, ONE)
    sizes = [len(c) for c in clients]
    assert len(sizes) == 7 and max(sizes) - min(sizes) <= 1
    assert all(c.domain == "cifar" for c in clients)


def test_dirichlet_complete() -> None:
    clients = Dirichlet(num_clients=6, beta=0.5).split(ONE, C, _rng(3))
    assert len(clients) == 6
    _check_complete(clients, ONE)


def test_centralised_holds_everything() -> None:
    (client,) = Centralised().split(ONE, C, _rng(0))
    assert client.domain == "cifar"
    np.testing.assert_array_equal(client.indices, np.arange(len(ONE["cifar"])))


@pytest.mark.parametrize("beta", [None, 0.5])
def test_domain_skew_full_fraction_is_complete_and_ordered(beta: float | None) -> None:
    clients = DomainSkew(fraction=1.0, clients_per_domain=3, beta=beta).split(LABELS, C, _rng(5))
    assert [c.domain for c in clients] == ["mnist"] * 3 + ["svhn"] * 3 + ["usps"] * 3
    _check_complete(clients, LABELS)


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.55])
@pytest.mark.parametrize("beta", [None, 1.0])
def test_domain_skew_fraction_takes_round_f_n(fraction: float, beta: float | None) -> None:
    clients = DomainSkew(fraction=fraction, clients_per_domain=2, beta=beta).split(LABELS, C, _rng(6))
    _check_valid(clients, LABELS)
    for domain, y in LABELS.items():
        assert sum(len(c) for c in clients if c.domain == domain) == round(fraction * len(y))


def test_domain_skew_fraction_is_a_uniform_sample() -> None:
    """The kept fraction is drawn uniformly: over seeds each index is kept about `fraction` of the time."""
    y = LABELS["svhn"]
    hits = np.zeros(len(y))
    for seed in range(200):
        for c in DomainSkew(fraction=0.3).split({"svhn": y}, C, _rng(seed)):
            hits[c.indices] += 1
    assert abs(hits.mean() / 200 - 0.3) < 0.01
    assert hits[: len(y) // 2].mean() / 200 == pytest.approx(hits[len(y) // 2 :].mean() / 200, abs=0.03)


def test_domain_skew_at_least_one_sample() -> None:
    (client,) = DomainSkew(fraction=0.001).split({"tiny": np.arange(C)}, C, _rng(0))
    assert len(client) == 1


def test_domain_skew_mapping() -> None:
    counts = {"mnist": 1, "svhn": 5, "usps": 2}
    clients = DomainSkew(fraction=0.5, clients_per_domain=counts).split(LABELS, C, _rng(0))
    assert [c.domain for c in clients] == ["mnist"] + ["svhn"] * 5 + ["usps"] * 2
    _check_valid(clients, LABELS)
    # the mapping's order does not matter: clients still follow the data's domain order
    reordered = DomainSkew(fraction=0.5, clients_per_domain=dict(reversed(list(counts.items())))).split(
        LABELS, C, _rng(0)
    )
    assert [c.domain for c in reordered] == [c.domain for c in clients]


def test_domain_skew_mapping_must_name_exactly_the_domains() -> None:
    with pytest.raises(DataError, match=r"missing \['usps'\]"):
        DomainSkew(clients_per_domain={"mnist": 1, "svhn": 2}).split(LABELS, C, _rng(0))
    with pytest.raises(DataError, match=r"missing \[\], extra \['syn'\]"):
        DomainSkew(clients_per_domain={"mnist": 1, "svhn": 2, "usps": 1, "syn": 1}).split(LABELS, C, _rng(0))


def _skew(make: Callable[[float], Partitioner], labels: dict[str, np.ndarray], beta: float) -> float:
    return float(np.mean([_mean_tv(make(beta).split(labels, C, _rng(s)), labels) for s in range(6)]))


@pytest.mark.parametrize(
    "make,labels",
    [
        (lambda beta: Dirichlet(num_clients=5, beta=beta), ONE),
        (lambda beta: DomainSkew(clients_per_domain=3, beta=beta), LABELS),
    ],
    ids=["dirichlet", "domain_skew"],
)
def test_label_skew_follows_beta(make: Callable[[float], Partitioner], labels: dict[str, np.ndarray]) -> None:
    skewed, mild, flat = _skew(make, labels, 0.05), _skew(make, labels, 1.0), _skew(make, labels, 100.0)
    assert skewed > 0.5, f"β=0.05 should be strongly skewed, mean TV {skewed:.3f}"
    assert skewed > mild > flat
    assert flat < 0.1, f"β=100 should be near-IID, mean TV {flat:.3f}"


def test_dirichlet_min_per_class_gives_every_client_every_class() -> None:
    for seed in range(5):
        clients = Dirichlet(num_clients=5, beta=0.05, min_per_class=1).split(ONE, C, _rng(seed))
        _check_complete(clients, ONE)
        for c in clients:
            assert np.all(np.bincount(ONE["cifar"][c.indices], minlength=C) >= 1)
    clients = DomainSkew(fraction=0.8, clients_per_domain=2, beta=0.05, min_per_class=2).split(LABELS, C, _rng(0))
    for c in clients:
        assert np.all(np.bincount(LABELS[c.domain][c.indices], minlength=C) >= 2)


def test_tiny_beta_can_leave_clients_empty_and_they_are_dropped() -> None:
    labels = {"d": np.repeat(np.arange(2), 3)}
    found = False
    for seed in range(50):
        clients = Dirichlet(num_clients=6, beta=0.01).split(labels, 2, _rng(seed))
        empty = sum(len(c) == 0 for c in clients)
        if empty:
            kept, dropped = drop_empty_clients(clients)
            assert dropped == empty and len(kept) == 6 - empty and all(len(c) for c in kept)
            found = True
            break
    assert found


def test_drop_empty_clients(caplog: pytest.LogCaptureFixture) -> None:
    clients = [
        ClientIndices("a", np.array([0, 2])),
        ClientIndices("a", np.array([], dtype=np.int64)),
        ClientIndices("b", np.array([1])),
        ClientIndices("b", np.array([], dtype=np.int64)),
    ]
    with caplog.at_level(logging.WARNING, logger="flsuite.data.partition"):
        kept, dropped = drop_empty_clients(clients)
    assert dropped == 2
    assert [(c.domain, c.indices.tolist()) for c in kept] == [("a", [0, 2]), ("b", [1])]
    assert "2 empty client" in caplog.text and "'a', position 1" in caplog.text and "'b', position 3" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flsuite.data.partition"):
        assert drop_empty_clients(kept) == (kept, 0)
    assert caplog.text == ""


def test_client_indices_are_sorted_int64() -> None:
    c = ClientIndices("d", np.array([5, 1, 3], dtype=np.int32))
    assert c.indices.dtype == np.int64 and c.indices.tolist() == [1, 3, 5] and len(c) == 3


# --- Office-Home-LDS ------------------------------------------------------------------------------------------------


def test_lds_coefficients_columns_sum_to_one() -> None:
    lds = LabelDomainSkew(beta=0.1)
    p = lds.coefficients(4, 65, _rng(0))
    assert p.shape == (4, 65)
    assert np.all(p >= 0)
    np.testing.assert_allclose(p.sum(axis=0), 1.0)
    # small β puts most of each class on one domain; large β spreads it evenly
    assert np.mean(p.max(axis=0)) > 0.8
    assert np.mean(LabelDomainSkew(beta=100.0).coefficients(4, 65, _rng(0)).max(axis=0)) < 0.35


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_lds_counts_are_floor_of_coefficient_times_class_size(beta: float) -> None:
    lds = LabelDomainSkew(beta=beta)
    clients, p = lds.split_with_coefficients(LABELS, C, _rng(4))
    np.testing.assert_array_equal(p, lds.coefficients(len(LABELS), C, _rng(4)))  # split draws P first
    assert p.shape == (3, C)
    np.testing.assert_allclose(p.sum(axis=0), 1.0)
    assert [c.domain for c in clients] == list(LABELS)
    _check_valid(clients, LABELS)
    for d, (client, y) in enumerate(zip(clients, LABELS.values(), strict=True)):
        held = np.bincount(y[client.indices], minlength=C)
        expected = np.floor(p[d] * np.bincount(y, minlength=C)).astype(int)
        np.testing.assert_array_equal(held, expected)
    # split() gives the same clients as split_with_coefficients()
    again = lds.split(LABELS, C, _rng(4))
    assert all(np.array_equal(a.indices, b.indices) for a, b in zip(clients, again, strict=True))


# --- Errors ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: IID(num_clients=0), r"num_clients.*0"),
        (lambda: Dirichlet(num_clients=-2), r"num_clients.*-2"),
        (lambda: Dirichlet(beta=0.0), r"beta.*0\.0"),
        (lambda: Dirichlet(beta=-1.0), r"beta.*-1\.0"),
        (lambda: Dirichlet(min_per_class=-1), r"min_per_class.*-1"),
        (lambda: DomainSkew(fraction=0.0), r"fraction.*0\.0"),
        (lambda: DomainSkew(fraction=1.5), r"fraction.*1\.5"),
        (lambda: DomainSkew(clients_per_domain=0), r"clients_per_domain.*0"),
        (lambda: DomainSkew(clients_per_domain={"a": 1, "b": 0}), r"clients_per_domain\['b'\].*0"),
        (lambda: DomainSkew(beta=0.0), r"beta.*0\.0"),
        (lambda: DomainSkew(min_per_class=1), r"min_per_class=1 needs beta"),
        (lambda: LabelDomainSkew(beta=-0.5), r"beta.*-0\.5"),
    ],
)
def test_bad_arguments_raise(make: Callable[[], Partitioner], match: str) -> None:
    with pytest.raises(DataError, match=match):
        make()


@pytest.mark.parametrize(
    "make", [lambda: IID(2), lambda: Dirichlet(2), lambda: Centralised()], ids=["iid", "dirichlet", "centralised"]
)
def test_single_domain_protocols_reject_several_domains(make: Callable[[], Partitioner]) -> None:
    with pytest.raises(DataError, match=r"3 domains \['mnist', 'svhn', 'usps'\].*DomainSkew"):
        make().split(LABELS, C, _rng(0))


def test_more_clients_than_samples_names_domain_and_numbers() -> None:
    with pytest.raises(DataError, match=r"'cifar' has 400 training samples .* 401 clients"):
        IID(num_clients=401).split(ONE, C, _rng(0))
    with pytest.raises(DataError, match=r"'cifar' has 400 training samples .* 500 clients"):
        Dirichlet(num_clients=500).split(ONE, C, _rng(0))
    # 10% of usps (250) is 25 samples, fewer than 30 clients
    with pytest.raises(DataError, match=r"'usps' has 25 training samples .* 30 clients"):
        DomainSkew(fraction=0.1, clients_per_domain={"mnist": 1, "svhn": 1, "usps": 30}).split(LABELS, C, _rng(0))


def test_impossible_min_per_class_names_class_and_counts() -> None:
    y = np.array([0] * 10 + [1] * 3 + [2] * 10)
    with pytest.raises(DataError, match=r"class 1 has 3 samples.*4 clients × 1 = 4"):
        Dirichlet(num_clients=4, min_per_class=1).split({"d": y}, 3, _rng(0))
    # a class absent from the domain cannot be given to every client either
    with pytest.raises(DataError, match=r"class 3 has 0 samples"):
        Dirichlet(num_clients=2, min_per_class=1).split({"d": y}, 4, _rng(0))


def test_labels_must_fit_num_classes() -> None:
    with pytest.raises(DataError, match=r"'cifar'.*\[0, 5\)"):
        IID(2).split(ONE, 5, _rng(0))


def test_min_size_redraws_the_split_until_every_client_has_enough():
    """NIID-Bench's rule (FedEGG A13): the whole split is drawn again from the same stream until min size is met."""
    from flsuite.data.index_splits import _dirichlet_draw

    labels = np.repeat(np.arange(10), 100)
    first = dirichlet_partition(labels, 30, 0.3, np.random.default_rng(2))
    assert min(len(p) for p in first) == 2  # the one-draw split leaves a client short
    parts = dirichlet_partition(labels, 30, 0.3, np.random.default_rng(2), min_size=5)
    assert min(len(p) for p in parts) >= 5 and sum(len(p) for p in parts) == 1000
    rng = np.random.default_rng(2)  # the same stream, drawn by hand until the rule holds
    draw = _dirichlet_draw(labels, 30, 0.3, rng, 0)
    while min(len(p) for p in draw) < 5:
        draw = _dirichlet_draw(labels, 30, 0.3, rng, 0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, draw))
    # a rule the first draw already meets changes nothing: min_size 0 and 1 give the one-draw split when no client is
    # empty
    easy = dirichlet_partition(labels, 5, 10.0, np.random.default_rng(0))
    assert all(
        np.array_equal(a, b)
        for a, b in zip(easy, dirichlet_partition(labels, 5, 10.0, np.random.default_rng(0), min_size=1))
    )


def test_min_size_that_cannot_be_met_names_the_numbers():
    labels = np.repeat(np.arange(2), 10)
    with pytest.raises(DataError, match="min_size=11 for each of 2 clients needs 22 samples; there are 20"):
        dirichlet_partition(labels, 2, 0.5, np.random.default_rng(0), min_size=11)
    with pytest.raises(DataError, match="no Dirichlet\\(beta=0.001\\) split .* min_size=10 samples in 3 draws"):
        dirichlet_partition(labels, 2, 0.001, np.random.default_rng(0), min_size=10, max_draws=3)
    with pytest.raises(DataError, match="min_size must be >= 0"):
        Dirichlet(num_clients=2, min_size=-1)
    split = Dirichlet(num_clients=4, beta=0.1, min_size=3).split(
        {"all": np.repeat(np.arange(2), 10)}, 2, np.random.default_rng(0)
    )
    assert min(len(c.indices) for c in split) >= 3


def test_domain_skew_client_fraction_is_the_official_fpl_fkpl_layout() -> None:
    """Every client of a domain holds int(f·n) samples of it, disjoint from its domain's other clients; FKPL's Office
    layout (4/3/2/1 clients at 0.25/0.25/0.5/1.0) on three domains here."""
    counts = {"mnist": 4, "svhn": 2, "usps": 1}
    shares = {"mnist": 0.25, "svhn": 0.3, "usps": 1.0}
    clients = DomainSkew(clients_per_domain=counts, client_fraction=shares).split(LABELS, C, _rng(3))
    _check_valid(clients, LABELS)
    assert [c.domain for c in clients] == ["mnist"] * 4 + ["svhn"] * 2 + ["usps"]
    for domain, y in LABELS.items():
        own = [c.indices for c in clients if c.domain == domain]
        assert [len(i) for i in own] == [int(shares[domain] * len(y))] * counts[domain]
        assert len(np.unique(np.concatenate(own))) == sum(len(i) for i in own)  # disjoint
    (usps,) = [c for c in clients if c.domain == "usps"]
    np.testing.assert_array_equal(usps.indices, np.arange(len(LABELS["usps"])))  # a single client at 1.0: all of it
    again = DomainSkew(clients_per_domain=counts, client_fraction=shares).split(LABELS, C, _rng(3))
    assert all(np.array_equal(a.indices, b.indices) for a, b in zip(clients, again))  # seeded


def test_domain_skew_client_fraction_errors() -> None:
    with pytest.raises(
        DataError,
        match=(
            r"domain 'mnist': 4 clients × client_fraction 0.3 of its 300 training samples \(90 each\) needs 1 <= "
            r"4 × 90 <= 300"
        ),
    ):
        DomainSkew(clients_per_domain=4, client_fraction=0.3).split(LABELS, C, _rng(0))
    with pytest.raises(DataError, match="needs fraction 1 and beta null, got fraction 0.5"):
        DomainSkew(fraction=0.5, client_fraction=0.2)
    with pytest.raises(DataError, match=r"client_fraction must name exactly the domains .*missing \['usps'\]"):
        DomainSkew(client_fraction={"mnist": 0.5, "svhn": 0.5}).split(LABELS, C, _rng(0))
    with pytest.raises(DataError, match="client_fraction must be in"):
        DomainSkew(client_fraction=0.0)
