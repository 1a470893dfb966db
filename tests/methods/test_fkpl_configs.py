"""Every shipped FKPL config runs FKPL: its Stage 0 on the shipped data gives more than one cluster and fewer than one
per client (V = 1 is the single-encoder control, V = M local training), and the pixel configs give the domains.

Computed as `flsuite fit` would (the config parsed, its data built, the run's derived seeds), on ../shared/data
(a config whose data is absent is skipped: DomainNet-4 here). The feature configs cluster their committed Stage-0
reference (tests/methods/fkpl_stage0_reference.py: every client's rows checked, the basis of the smallest client's
first images recomputed through the encoder) instead of embedding every image; so does PACS at 128 px (the reference:
its bases' and its official Stage 0's bases' inner products, which are all Stage 0 reads of them; every client's rows
checked, two clients' bases recomputed for both) instead of 20 SVDs of 49,152-pixel clients. Full table:
docs/results/fkpl_stage0.md, from `python experiments/fkpl_stage0.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import yaml

from flsuite.cli import federation_from_configs
from flsuite.data import image_folder
from flsuite.data.base import ClientData
from flsuite.data.image_arrays import ImageArrays
from flsuite.methods.fkpl import FKPL
from flsuite.methods.fkpl.cluster import angle_matrix, cluster, purity
from flsuite.methods.fkpl.subspace import SubspaceBasis, client_bases, client_basis
from flsuite.paths import data_path
from tests.methods import fkpl_stage0_reference as reference

REPO = Path(__file__).resolve().parents[2]
FKPL_CONFIGS = REPO / "configs" / "fkpl"
OFFICIAL = FKPL_CONFIGS / "stage0_official.yaml"
#: The pixel configs' Stage 0 on the shipped images: (V, purity) at their threshold; the paper's threshold.
PIXELS = {"office_caltech10_resnet10.yaml": ((4, 1.0), 5.3), "pacs_resnet18.yaml": ((4, 1.0), 4.2)}


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _is_fkpl(cfg: dict) -> bool:
    return str(cfg.get("method", {}).get("class_path", "")).endswith("fkpl.FKPL")


#: Full configs (a data source and a method), not overlays.
SHIPPED = sorted(
    p for p in FKPL_CONFIGS.rglob("*.yaml") if "class_path" in _yaml(p).get("data", {}) and _is_fkpl(_yaml(p))
)


def test_the_shipped_fkpl_configs_are_found_and_only_the_declared_control_fixes_one_cluster():
    assert {p.name for p in SHIPPED} >= {
        *PIXELS,
        "office_caltech10_effnet.yaml",
        "pacs_effnet.yaml",
        "domainnet4_resnet18.yaml",
    }
    fixed = {
        str(p.relative_to(FKPL_CONFIGS)): _yaml(p).get("method", {}).get("init_args", {}).get("assignment")
        for p in FKPL_CONFIGS.rglob("*.yaml")
    }
    single = {name for name, assignment in fixed.items() if assignment == "single"}
    assert single == {"controls/fedavg_encoder.yaml"}


@contextmanager
def _pixels_on_demand() -> Iterator:
    """Inside: folder images load as their labels alone, each row a zero-stride blank image (a layout reads labels
    and row counts only, so it needs no decoded image). Yields `decode(layout, clients)`, which loads the pools of
    those clients' domains with the real loader and checks that they hold the labels the layout was computed from:
    only the images of the clients whose bases are recomputed are decoded."""
    real = image_folder.load_image_folder_arrays
    deferred: dict[int, tuple] = {}

    def labels_only(entries, size, classes=None, **kwargs) -> ImageArrays:
        entries = list(entries)
        h, w = image_folder._hw(size)
        y = torch.tensor([int(label) for _, label in entries], dtype=torch.int64)
        blank = torch.zeros((1, 3, h, w), dtype=torch.uint8).expand(len(entries), -1, -1, -1)
        pool = ImageArrays(
            blank, y, tuple(classes) if classes is not None else tuple(map(str, range(int(y.max()) + 1)))
        )
        deferred[id(pool)] = (entries, size, classes, kwargs)
        return pool

    def decode(layout, clients) -> None:
        for i in clients:
            data = layout.domains[layout.clients[i][0]]
            if id(data.train_pool) not in deferred:
                continue
            entries, size, classes, kwargs = deferred.pop(id(data.train_pool))
            pool = real(entries, size, classes, **kwargs)
            assert torch.equal(pool.y, data.train_pool.y), "an image that did not decode changed the rows"
            if data.test_pool is data.train_pool:
                data.test_pool = pool
            data.train_pool = pool

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(image_folder, "load_image_folder_arrays", labels_only)
        yield decode


def _largest_principal_angle(a: torch.Tensor, b: torch.Tensor) -> float:
    """Degrees between two orthonormal bases' spans (0 when they span the same subspace)."""
    cosines = torch.linalg.svdvals(a.double().T @ b.double()).clamp(max=1.0)
    return float(torch.rad2deg(torch.arccos(cosines.min())))


def _referenced_bases(config: Path, federation, fkpl: FKPL) -> tuple[list[torch.Tensor], list[str]]:
    """A feature config's committed Stage-0 bases, checked against the data the config builds (module docstring)."""
    ref = reference.load(config)
    source, query = federation.data, fkpl.subspace_query()
    stale = f"the Stage-0 reference of {config.name} is stale; regenerate: {reference.REGENERATE}"
    assert (ref.query, ref.seed, ref.encoder) == (repr(query), federation.seed, reference.encoder_key(source)), stale
    with _pixels_on_demand() as decode:
        layout = source.layout(federation.seed)
    assert ref.rows == reference.row_digests(layout.clients), stale
    spot, k = reference.spot_layout(layout, ref.spot[1])  # the smallest client's first images: few to embed
    decode(spot, [0])
    assert ref.spot == (k, len(spot.clients[0][1])), stale
    recomputed = client_basis(ClientData(k, spot.clients[0][0], source.client_split(spot, 0)), query, federation.seed)
    # float32 rounding moves a basis 0.007-0.010°; one image fewer 3.8-4.3°; features + N(0, 0.01²) noise 1.1-1.5°
    # (PACS)
    assert _largest_principal_angle(recomputed, ref.spot_basis) < 0.5, stale
    return ref.bases, [domain for domain, _ in layout.clients]


def _principal_angles(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Every principal angle (degrees) between the spans of two bases, orthonormal or not."""
    qa, qb = torch.linalg.qr(a.double())[0], torch.linalg.qr(b.double())[0]
    return torch.rad2deg(torch.arccos(torch.linalg.svdvals(qa.T @ qb).clamp(max=1.0)))


def _gram_bases(
    config: Path, federation, fkpl: FKPL, official: FKPL
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[str]]:
    """A pixel config's committed Stage-0 Gram factors (its query's and the official one's), checked against the data
    the config builds: every client's rows, and the smallest client's and the smallest other-domain client's bases
    recomputed from their images for both queries, whose principal angles must be the reference's."""
    ref = reference.load(config)
    assert isinstance(ref, reference.GramReference)
    source, seed = federation.data, federation.seed
    queries = fkpl.subspace_query(), official.subspace_query()
    stale = f"the Stage-0 reference of {config.name} is stale; regenerate: {reference.REGENERATE}"
    assert (ref.query, ref.official_query, ref.seed, ref.pixels) == (
        *map(repr, queries),
        seed,
        reference.pixels_key(source),
    ), stale
    with _pixels_on_demand() as decode:
        layout = source.layout(seed)
    assert ref.rows == reference.row_digests(layout.clients), stale
    domains = [domain for domain, _ in layout.clients]
    size = {i: len(rows) for i, (_, rows) in enumerate(layout.clients)}
    k = min(size, key=size.__getitem__)
    other = min((i for i in size if domains[i] != domains[k]), key=size.__getitem__)
    decode(layout, (k, other))
    clients = [ClientData(i, domains[i], source.client_split(layout, i)) for i in (k, other)]
    for query, bases in zip(queries, (ref.bases, ref.official_bases), strict=True):
        recomputed = [client_basis(client, query, seed) for client in clients]
        # the reference reproduces them to 1e-10°; images resized nearest-neighbour instead of bilinear move them
        # 0.08-4.7°
        assert torch.allclose(
            _principal_angles(*recomputed), _principal_angles(bases[k], bases[other]), rtol=0.0, atol=0.01
        ), stale
    return ref.bases, ref.official_bases, domains


def _stage0_bases(
    config: Path, federation, fkpl: FKPL, official: FKPL | None
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, list[str]]:
    """Every client's Stage-0 basis under the config's query and, for a pixel config, under the official one; and the
    clients' domains. A feature config's from its committed reference, a pixel config's from its reference where it
    has one (both checked against the data the config builds), else computed on the data."""
    if federation.data.encoder is not None:
        bases, domains = _referenced_bases(config, federation, fkpl)
        return bases, None, domains
    if official is not None and reference.exists(config):
        return _gram_bases(config, federation, fkpl, official)
    fed, _ = federation.build_data()
    on_official = client_bases(fed, official.subspace_query(), federation.seed) if official is not None else None
    return (
        client_bases(fed, fkpl.subspace_query(), federation.seed),
        on_official,
        [client.domain for client in fed.clients],
    )


@pytest.mark.slow
@pytest.mark.parametrize("config", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_fkpl_config_has_more_than_one_and_fewer_than_m_clusters(config, monkeypatch):
    monkeypatch.setenv("FLSUITE_DATA", str(REPO))  # the configs' roots are relative to the checkout
    federation = federation_from_configs(config)
    root = data_path(federation.data.root)
    if not root.is_dir():
        pytest.skip(f"data not on this machine: {root}")
    fkpl = federation.method
    assert isinstance(fkpl, FKPL) and fkpl.stage0.assignment == "subspace"
    official = federation_from_configs(config, OFFICIAL).method if config.name in PIXELS else None
    bases, official_bases, domains = _stage0_bases(config, federation, fkpl, official)
    labels = cluster(angle_matrix(bases, fkpl.stage0.angle), fkpl.stage0.threshold, fkpl.stage0.linkage)
    assert 1 < max(labels) + 1 < len(bases), labels
    if official is None:
        return
    assert official_bases is not None
    expected, paper = PIXELS[config.name]
    assert (max(labels) + 1, purity(labels, domains)) == expected
    # why the pixel configs take neither the exact angle nor the official Stage 0: one cluster, one per client
    assert set(cluster(angle_matrix(bases, "exact"), fkpl.stage0.threshold)) == {0}
    on_official = cluster(angle_matrix(official_bases, official.stage0.angle), paper, official.stage0.linkage)
    assert max(on_official) + 1 == len(bases)


def test_the_official_stage0_overlay_sets_exactly_the_official_options():
    stage0 = {
        "basis",
        "per_class",
        "class_budget",
        "angle",
        "linkage",
        "stage0_size",
        "stage0_augment",
        "stage0_normalize",
    }
    assert set(_yaml(OFFICIAL)["method"]["init_args"]) == stage0
    base = federation_from_configs(FKPL_CONFIGS / "pacs_resnet18.yaml").method
    method = federation_from_configs(FKPL_CONFIGS / "pacs_resnet18.yaml", OFFICIAL).method
    assert method.subspace_query() == SubspaceBasis(
        10, per_class=True, budget="counts", size=32, augment=True, normalize=True
    )
    assert (method.stage0.angle, method.stage0.linkage, method.stage0.threshold) == (
        "pacfl",
        "weighted",
        base.stage0.threshold,
    )


def test_the_official_stage0_overlay_for_features_sets_the_official_options_that_apply_to_features():
    """The feature configs hold no pixels, so their official Stage 0 is the official basis, angle and linkage without
    the image transform (configs/fkpl/stage0_official_features.yaml, experiments/fkpl_official.sh)."""
    features = FKPL_CONFIGS / "stage0_official_features.yaml"
    assert set(_yaml(features)["method"]["init_args"]) == {"basis", "per_class", "class_budget", "angle", "linkage"}
    assert {k: v for k, v in _yaml(OFFICIAL)["method"]["init_args"].items() if not k.startswith("stage0_")} == _yaml(
        features
    )["method"]["init_args"]
    base = federation_from_configs(FKPL_CONFIGS / "pacs_effnet.yaml").method
    method = federation_from_configs(FKPL_CONFIGS / "pacs_effnet.yaml", features).method
    assert method.subspace_query() == SubspaceBasis(10, per_class=True, budget="counts")
    assert (method.stage0.angle, method.stage0.linkage, method.stage0.threshold) == (
        "pacfl",
        "weighted",
        base.stage0.threshold,
    )
