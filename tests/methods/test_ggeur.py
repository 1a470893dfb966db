"""GGEUR: exact identities (Eq. 4), the generated distribution, counts, Step 2 rules, determinism, composition."""

from __future__ import annotations

import json

import pytest
import torch

from flsuite.data.base import ClientData, FederatedData, Split
from flsuite.data.builtin import GaussianFeatures
from flsuite.methods.ggeur import GGEUR, class_statistics, generate, geometry, pooled_covariance, similarity
from tests.helpers import head_federation


def test_eq4_from_client_statistics_equals_the_pooled_covariance():
    g = torch.Generator().manual_seed(0)
    sizes = [3, 17, 1, 40, 9]  # uneven, including a single-sample client
    clients = [torch.randn(n, 6, generator=g, dtype=torch.float64) * (k + 1) + k for k, n in enumerate(sizes)]
    pooled = pooled_covariance([class_statistics(x) for x in clients])
    everything = torch.cat(clients)
    expected = torch.cov(everything.T, correction=0)
    assert pooled.count == sum(sizes)
    torch.testing.assert_close(pooled.mean, everything.mean(0), rtol=0, atol=1e-10)
    torch.testing.assert_close(pooled.cov, expected, rtol=0, atol=1e-8)


def test_geometry_is_sorted_clipped_and_reconstructs():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(5, 3, generator=g, dtype=torch.float64)
    cov = a.T @ a / 5 - 1e-12 * torch.eye(3)  # nearly singular: tiny negative eigenvalues possible
    shape = geometry(cov)
    assert torch.all(shape.eigenvalues[:-1] >= shape.eigenvalues[1:]) and torch.all(shape.eigenvalues >= 0)
    torch.testing.assert_close(
        shape.eigenvectors @ torch.diag(shape.eigenvalues) @ shape.eigenvectors.T, cov, atol=1e-10, rtol=0
    )
    assert geometry(cov, top_k=2).eigenvectors.shape == (3, 2)


@pytest.mark.parametrize(("eig_scale", "power"), [("sqrt", 1), ("lambda", 2)])
def test_generated_noise_has_the_intended_covariance(eig_scale, power):
    g = torch.Generator().manual_seed(2)
    a = torch.randn(4, 4, generator=g, dtype=torch.float64)
    cov = a @ a.T / 4 + 0.1 * torch.eye(4)
    draws = generate(torch.zeros(1, 4), geometry(cov), 200_000, g, eig_scale)
    empirical = torch.cov(draws.T, correction=0)
    target = torch.linalg.matrix_power(cov, power)
    assert torch.linalg.norm(empirical - target) / torch.linalg.norm(target) < 0.02
    other = torch.linalg.matrix_power(cov, 3 - power)
    assert torch.linalg.norm(empirical - other) / torch.linalg.norm(other) > 0.1  # and clearly not the other one


def test_similarity_eq3_is_top_for_equal_shapes_and_sign_invariant():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(8, 8, generator=g, dtype=torch.float64)
    shape = geometry(a @ a.T)
    flipped = type(shape)(shape.eigenvalues, -shape.eigenvectors)
    assert similarity(shape, flipped) == pytest.approx(5.0)
    b = torch.randn(8, 8, generator=g, dtype=torch.float64)
    assert 0 <= similarity(shape, geometry(b @ b.T)) < 5.0


def toy_federation(missing_class_client: int | None = None) -> FederatedData:
    """3 domains × 1 client, 3 classes, 5-d features; optionally one client lacks class 2."""
    g = torch.Generator().manual_seed(4)
    clients = []
    for k, n in enumerate([30, 7, 12]):
        y = torch.arange(n * 3) % 3
        if k == missing_class_client:
            y[y == 2] = 0
        clients.append(ClientData(k, f"d{k}", Split(torch.randn(len(y), 5, generator=g) + k, y)))
    test = {f"d{k}": Split(torch.randn(6, 5, generator=g), torch.arange(6) % 3) for k in range(3)}
    return FederatedData(clients, test, num_classes=3)


def counts(split: Split, num_classes: int = 3) -> list[int]:
    return torch.bincount(split.y, minlength=num_classes).tolist()


def test_multi_domain_counts_match_the_targets_exactly():
    data = toy_federation()
    out = GGEUR(target_per_class=20, samples_per_prototype=4).run(data, seed=0).data
    # Step 1: each class topped up to 20 (client 0 has 30 per class: nothing generated); Step 2: 2 other domains × 4
    assert counts(out.clients[0].train) == [30 + 8] * 3
    assert counts(out.clients[1].train) == [20 + 8] * 3
    assert counts(out.clients[2].train) == [20 + 8] * 3
    originals = data.clients[1].train
    assert torch.equal(out.clients[1].train.x[: len(originals)], originals.x)  # originals kept, in front


def test_missing_class_gets_step2_samples_in_multi_domain_mode_only():
    data = toy_federation(missing_class_client=1)
    multi = GGEUR(mode="multi", target_per_class=20, samples_per_prototype=4).run(data, seed=0).data
    assert counts(multi.clients[1].train)[2] == 2 * 4  # only Step 2, around the two other domains' prototypes
    single = GGEUR(mode="single", target_per_class=20).run(data, seed=0).data
    assert counts(single.clients[1].train)[2] == 0
    assert counts(single.clients[1].train)[:2] == [20, 20]
    step1_only = GGEUR(mode="multi", target_per_class=20, step2=False).run(data, seed=0).data
    assert counts(step1_only.clients[1].train) == [20, 20, 0]


def test_same_seed_same_samples_other_seed_different():
    data = toy_federation()
    a, b, c = (GGEUR(target_per_class=25, samples_per_prototype=3).run(data, seed=s).data for s in (1, 1, 2))
    assert all(torch.equal(x.train.x, y.train.x) for x, y in zip(a.clients, b.clients))
    assert not torch.equal(a.clients[1].train.x, c.clients[1].train.x)


def test_generated_samples_follow_the_global_class_geometry():
    """Step 1 around originals with √λ: the augmented class covariance approaches (pooled Σ + local spread)."""
    data = toy_federation()
    out = GGEUR(mode="single", target_per_class=5000).run(data, seed=0)
    x, y = out.data.clients[1].train.x, out.data.clients[1].train.y
    original = data.clients[1].train
    pooled = pooled_covariance([class_statistics(c.train.x[c.train.y == 0]) for c in data.clients]).cov
    local = class_statistics(original.x[original.y == 0]).cov
    generated = x[len(original) :][y[len(original) :] == 0].double()
    empirical = torch.cov(generated.T, correction=0)
    assert torch.linalg.norm(empirical - (pooled + local)) / torch.linalg.norm(pooled + local) < 0.1
    assert out.metrics["bytes_up"] == 3 * 3 * (1 + 5 + 25) * 8  # 3 clients × 3 classes × (n, μ, Σ) in float64


def test_ggeur_composes_with_fedavg_by_config(tmp_path):
    data = GaussianFeatures(
        dim=6, num_classes=3, num_domains=2, clients_per_domain=1, samples_per_client=30, test_per_domain=30
    )
    summary = head_federation(
        tmp_path, data=data, rounds=2, setup=[GGEUR(target_per_class=50, samples_per_prototype=20)]
    ).fit()
    assert summary["last/acc_mean"] > 70  # 3 classes: chance is 33.3; a run that learned nothing stays near it
    stats = json.loads((tmp_path / "partition.json").read_text())
    assert [c["num_samples"] for c in stats["clients"]] == [3 * 50 + 3 * 20] * 2
    setup = json.loads((tmp_path / "setup.json").read_text())
    assert setup["setup/ggeur/bytes_up"] > 0 and setup["setup/ggeur/generated"] == 2 * (3 * 50 + 3 * 20 - 30)


def test_ggeur_refuses_pixels():
    from flsuite.data.base import DataError

    images = FederatedData(
        [ClientData(0, "d", Split(torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long)))],
        {"d": Split(torch.zeros(2, 1, 8, 8), torch.zeros(2, dtype=torch.long))},
        2,
    )
    with pytest.raises(DataError, match="embedding vectors"):
        GGEUR().run(images, seed=0)


def test_the_console_says_what_ggeur_did(tmp_path, caplog):
    data = GaussianFeatures(
        dim=6, num_classes=3, num_domains=2, clients_per_domain=1, samples_per_client=30, test_per_domain=30
    )
    with caplog.at_level("INFO", logger="flsuite.federation.run"):
        head_federation(
            tmp_path, data=data, rounds=1, setup=[GGEUR(target_per_class=50, samples_per_prototype=20)]
        ).fit()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("GGEUR:")]
    assert len(lines) == 1 and lines[0].startswith(
        f"GGEUR: {2 * (3 * 50 + 3 * 20 - 30):,} embeddings generated (multi-domain, T = 50;"
    )
