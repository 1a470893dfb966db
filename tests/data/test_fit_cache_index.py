"""`flsuite fit` decides "already embedded" from the feature cache's index (issue 35, item 3): on a hit the data is
built from the cache files alone (no image decoded, no encoder built), the same tensors bit for bit as the build; a
changed image is a miss and the build runs as before."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch

from flsuite.data import image_folder
from flsuite.data.base import FederatedData
from tests.data.test_feature_cache import CountingEncoder, _office_config
from tests.helpers import run_cli


def _fit_data(config: Path) -> tuple[object, FederatedData]:
    """The data source `flsuite fit --config CONFIG` runs on (`fit_federation`: the index consulted) and its build."""
    from flsuite.cli import resolved_config_yaml
    from flsuite.cli_parsers import fit_parser
    from flsuite.fit_data import fit_federation

    parser = fit_parser()
    cfg = parser.parse_args(["--config", str(config)])
    federation = fit_federation(parser, cfg, resolved_config_yaml(parser, cfg))
    return federation.data, federation.data.build(federation.seed)


def _same_data(a: FederatedData, b: FederatedData) -> None:
    assert [(c.client_id, c.domain) for c in a.clients] == [(c.client_id, c.domain) for c in b.clients]
    for ca, cb in zip(a.clients, b.clients):
        assert torch.equal(ca.train.x, cb.train.x) and torch.equal(ca.train.y, cb.train.y)
    assert list(a.test) == list(b.test) and all(
        torch.equal(a.test[d].x, b.test[d].x) and torch.equal(a.test[d].y, b.test[d].y) for d in a.test
    )
    assert a.classes == b.classes and a.num_classes == b.num_classes and a.partition_stats() == b.partition_stats()


def _forbid_decoding_and_encoder(patch: pytest.MonkeyPatch) -> None:
    def not_built(self, *args, **kwargs):
        raise AssertionError("the encoder was built")

    def not_decoded(*args, **kwargs):
        raise AssertionError("images were decoded")

    patch.setattr(CountingEncoder, "__init__", not_built)
    patch.setattr(image_folder, "load_image_folder_arrays", not_decoded)


def test_fit_on_an_indexed_cache_reads_the_cache_files_alone_and_runs_the_same(
    tmp_path: Path, capsys, caplog, monkeypatch
) -> None:
    config = _office_config(tmp_path)
    _, built = _fit_data(config)  # no index yet: the build (decodes and embeds), as before
    assert run_cli(["fit", "--config", str(config), "--run_dir", str(tmp_path / "built")], capsys)[0] == 0

    assert run_cli(["features", "--config", str(config)], capsys)[0] == 0  # records the build, with its pools
    entries = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "index").glob("*.json")]
    assert entries and all(
        sorted(e["pools"]) == [f"office_caltech10/{d}/all/12/{tmp_path / 'office'}" for d in ("amazon", "webcam")]
        for e in entries
    )

    with monkeypatch.context() as patch, caplog.at_level(logging.INFO, logger="flsuite"):
        _forbid_decoding_and_encoder(patch)
        source, served = _fit_data(config)
        _same_data(served, built)  # every client's and test split's features and labels, bit for bit
        assert source.encoder is None  # never built
        caplog.clear()
        code, _, err = run_cli(["fit", "--config", str(config), "--run_dir", str(tmp_path / "indexed")], capsys)
        assert code == 0, err
    said = [r.getMessage() for r in caplog.records if "already embedded (feature cache index)" in r.getMessage()]
    images = sum(len(c.train) for c in built.clients) + sum(len(s) for s in built.test.values())
    assert len(said) == 1 and said[0].startswith(
        f"already embedded (feature cache index): {images:,} images, {tmp_path / 'cache'}, decided in "
    )
    assert (tmp_path / "indexed" / "metrics.jsonl").read_bytes() == (tmp_path / "built" / "metrics.jsonl").read_bytes()


def test_a_changed_image_or_a_stale_cache_file_is_a_miss_that_builds_as_before(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    config = _office_config(tmp_path)
    assert run_cli(["features", "--config", str(config)], capsys)[0] == 0
    _, served = _fit_data(config)
    image = tmp_path / "office" / "webcam" / "mug" / "1.png"
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
    built_encoders = []
    real_init = CountingEncoder.__init__

    def counting_init(self, *args, **kwargs):
        built_encoders.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(CountingEncoder, "__init__", counting_init)
    source, rebuilt = _fit_data(config)  # a miss: the encoder is built and the images decoded
    assert built_encoders and source.encoder is built_encoders[-1]
    _same_data(rebuilt, served)

    # An entry whose cache file lacks a row (written behind the index's back with the same size and mtime is not
    # noticed; a row mask that says otherwise is): the build runs as without the index, the encoder built then.
    assert run_cli(["features", "--config", str(config)], capsys)[0] == 0
    cache = next(
        Path(p)
        for e in (tmp_path / "cache" / "index").glob("*.json")
        for p in [next(iter(json.loads(e.read_text())["pools"].values()))["cache"]]
    )
    payload = torch.load(cache, weights_only=True)
    payload["done"][0] = False
    stat = cache.stat()
    tmp = cache.parent / f".{cache.name}.abcdefgh.tmp"  # the name length `extract_features` writes it under: same size
    torch.save(payload, tmp)
    os.replace(tmp, cache)
    os.utime(cache, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cache.stat().st_size == stat.st_size
    built_encoders.clear()
    source, fallback = _fit_data(config)
    assert len(built_encoders) == 1 and source.encoder is built_encoders[0]
    assert (tmp_path / "cache" / cache.name).stat().st_mtime_ns != stat.st_mtime_ns  # the lacking row embedded again:
    refilled = fallback.clients[0].train.x  # (alone, not in its batch: equal to rounding)
    assert torch.allclose(refilled, served.clients[0].train.x, atol=1e-6) and torch.equal(
        fallback.clients[1].train.x, served.clients[1].train.x
    )
