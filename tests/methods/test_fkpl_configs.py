"""The shipped FKPL pixel config runs FKPL: its Stage 0 on the shipped images gives the domains' clusters, not one.

Computed as `flsuite fit` would (the config parsed and its data built), on ../shared/data (skipped when absent).
The PACS and DomainNet pixel configs take minutes or data this machine lacks: docs/results/fkpl_stage0.md, from
`python experiments/fkpl_stage0.py configs/fkpl/*.yaml`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flsuite.cli import federation_from_configs
from flsuite.methods.fkpl_cluster import SubspaceBasis, angle_matrix, cluster, purity

REPO = Path(__file__).resolve().parents[2]
OFFICE = REPO.parent / "shared" / "data" / "office_caltech_10"


@pytest.mark.skipif(not OFFICE.is_dir(), reason=f"shared data not present: {OFFICE}")
def test_the_office_pixel_config_clusters_its_clients_into_their_domains(monkeypatch):
    monkeypatch.setenv("FLSUITE_DATA", str(REPO))  # the config's root is relative to the checkout
    federation = federation_from_configs(REPO / "configs" / "fkpl" / "office_caltech10_resnet10.yaml")
    fed, _ = federation.build_data()
    fkpl = federation.method
    bases = [SubspaceBasis(fkpl.basis, fkpl.per_class).compute(client, None, None)["basis"] for client in fed.clients]
    domains = [client.domain for client in fed.clients]
    assert {d: domains.count(d) for d in set(domains)} == {"caltech": 4, "amazon": 3, "webcam": 2, "dslr": 1}  # the official layout
    labels = cluster(angle_matrix(bases, fkpl.angle), fkpl.threshold)
    assert (max(labels) + 1, purity(labels, domains)) == (4, 1.0)
    # why the config takes PACFL's angle: with the exact θ1 every client falls in one cluster at its threshold
    assert set(cluster(angle_matrix(bases, "exact"), fkpl.threshold)) == {0}
