"""Feature extraction: batching, on-disk cache hits/misses, corrupted entries."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from flsuite.data.feature_cache import extract_features
from flsuite.models.encoders import TorchvisionBackbone
from flsuite.models.frozen_encoder import FrozenEncoder
from flsuite.models.image_preprocessing import prepare_images


class CountingEncoder(FrozenEncoder):
    """Tiny conv encoder with BatchNorm (train-mode BN would break batching invariance)."""

    def __init__(self, seed: int = 0, embed_dim: int = 6) -> None:
        super().__init__("cpu")
        torch.manual_seed(seed)
        self.net = nn.Sequential(
            nn.Conv2d(3, 4, 3),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4, embed_dim),
        )
        with torch.no_grad():
            self.net[1].running_mean.uniform_(-0.5, 0.5)
            self.net[1].running_var.uniform_(0.5, 2.0)
        self.embed_dim = embed_dim
        self.calls = 0
        self.images_seen = 0
        self._freeze()

    def config_key(self) -> dict[str, str]:
        return {"kind": "counting"}

    def preprocess(self, images_uint8: Tensor) -> Tensor:
        return prepare_images(images_uint8, size=12, mean=(127.5,) * 3, std=(127.5,) * 3)

    def encode(self, pixels: Tensor) -> Tensor:
        self.calls += 1
        self.images_seen += pixels.shape[0]
        return self.net(pixels)


def make_images(n: int = 20, seed: int = 0, channels: int = 1) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, channels, 10, 10), dtype=torch.uint8, generator=g)


KEY = {"dataset": "digits_offline", "domain": "mnist", "split": "train", "transform": "none"}


def cache_files(cache_dir: Path, suffix: str = ".pt") -> list[Path]:
    return sorted(cache_dir.glob(f"*{suffix}"))


def test_without_cache_returns_cpu_float32_and_batches() -> None:
    encoder = CountingEncoder()
    features = extract_features(encoder, make_images(20), batch_size=8)
    assert features.shape == (20, 6) and features.dtype == torch.float32 and features.device.type == "cpu"
    assert encoder.calls == 3 and encoder.images_seen == 20
    assert not features.is_inference()


def test_batching_invariance() -> None:
    encoder = CountingEncoder()
    images = make_images(50)
    small = extract_features(encoder, images, batch_size=7)
    large = extract_features(encoder, images, batch_size=64)
    torch.testing.assert_close(small, large, rtol=1e-5, atol=1e-6)
    one_by_one = torch.cat([encoder(images[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(small[:3], one_by_one, rtol=1e-5, atol=1e-6)


def test_batching_invariance_resnet18() -> None:
    torch.manual_seed(0)
    encoder = TorchvisionBackbone("resnet18", weights=None, image_size=32)
    images = make_images(16, channels=3)
    torch.testing.assert_close(
        extract_features(encoder, images, batch_size=7),
        extract_features(encoder, images, batch_size=64),
        rtol=1e-4,
        atol=1e-5,
    )


def test_cache_hit_on_second_call(tmp_path: Path) -> None:
    encoder = CountingEncoder()
    images = make_images(20)
    first = extract_features(encoder, images, batch_size=8, cache_dir=tmp_path, dataset_key=KEY)
    assert encoder.calls == 3
    (pt_file,) = cache_files(tmp_path)
    (json_file,) = cache_files(tmp_path, ".json")
    assert json_file.stem == pt_file.stem
    readable = json.loads(json_file.read_text())
    assert readable["key"]["dataset"] == KEY and readable["key"]["images"]["shape"] == "20x1x10x10"
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*"))

    encoder.calls = 0
    second = extract_features(encoder, images, batch_size=5, cache_dir=tmp_path, dataset_key=dict(KEY))
    assert encoder.calls == 0
    assert torch.equal(first, second)
    assert second.dtype == torch.float32 and not second.is_inference()
    # a fresh but identical encoder (same weights) also hits
    twin = CountingEncoder()
    assert torch.equal(extract_features(twin, images.clone(), cache_dir=tmp_path, dataset_key=KEY), first)
    assert twin.calls == 0


def test_cache_misses_on_different_key_images_or_encoder(tmp_path: Path) -> None:
    encoder = CountingEncoder()
    images = make_images(20)
    extract_features(encoder, images, cache_dir=tmp_path, dataset_key=KEY)
    assert encoder.calls == 1

    extract_features(encoder, images, cache_dir=tmp_path, dataset_key={**KEY, "split": "test"})
    assert encoder.calls == 2

    changed = images.clone()
    changed[3, 0, 4, 4] ^= 1
    extract_features(encoder, changed, cache_dir=tmp_path, dataset_key=KEY)
    assert encoder.calls == 3

    other = CountingEncoder(seed=1)
    other_features = extract_features(other, images, cache_dir=tmp_path, dataset_key=KEY)
    assert other.calls == 1
    assert not torch.allclose(other_features, extract_features(encoder, images, cache_dir=tmp_path, dataset_key=KEY))
    assert encoder.calls == 3  # still a hit for the first encoder
    assert len(cache_files(tmp_path)) == 4


def test_corrupted_cache_file_is_recomputed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    encoder = CountingEncoder()
    images = make_images(12)
    expected = extract_features(encoder, images, cache_dir=tmp_path, dataset_key=KEY)
    (pt_file,) = cache_files(tmp_path)
    pt_file.write_bytes(pt_file.read_bytes()[:100])  # truncated

    encoder.calls = 0
    with caplog.at_level(logging.WARNING, logger="flsuite.data.feature_cache"):
        recomputed = extract_features(encoder, images, cache_dir=tmp_path, dataset_key=KEY)
    assert encoder.calls == 1
    assert "unreadable" in caplog.text
    torch.testing.assert_close(recomputed, expected)
    extract_features(encoder, images, cache_dir=tmp_path, dataset_key=KEY)
    assert encoder.calls == 1  # the rewritten entry is valid again


@pytest.mark.parametrize("tamper", ["key", "shape", "not-a-dict"])
def test_mismatching_cache_file_is_recomputed(tmp_path: Path, tamper: str, caplog: pytest.LogCaptureFixture) -> None:
    encoder = CountingEncoder()
    images = make_images(12)
    expected = extract_features(encoder, images, cache_dir=tmp_path, dataset_key=KEY)
    (pt_file,) = cache_files(tmp_path)
    payload = torch.load(pt_file, weights_only=True)
    if tamper == "key":
        payload = {"features": torch.zeros(12, 6), "key": {**payload["key"], "dataset": {"other": "x"}}}
    elif tamper == "shape":
        payload = {"features": torch.zeros(11, 6), "key": payload["key"]}
    else:
        payload = torch.zeros(12, 6)
    torch.save(payload, pt_file)

    encoder.calls = 0
    with caplog.at_level(logging.WARNING, logger="flsuite.data.feature_cache"):
        recomputed = extract_features(encoder, images, cache_dir=tmp_path, dataset_key=KEY)
    assert encoder.calls == 1
    assert "recomputing" in caplog.text
    torch.testing.assert_close(recomputed, expected)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        extract_features(CountingEncoder(), make_images(2), batch_size=0)
    with pytest.raises(ValueError, match="N, C, H, W"):
        extract_features(CountingEncoder(), make_images(2)[0])


def test_row_subsets_fill_one_pool_entry_incrementally(tmp_path: Path) -> None:
    encoder = CountingEncoder()
    images = make_images(20)
    full = extract_features(encoder, images)
    encoder.images_seen = 0
    a = extract_features(encoder, images, rows=[4, 0, 1, 2, 3], cache_dir=tmp_path, dataset_key=KEY)
    assert encoder.images_seen == 5 and torch.allclose(a, full[[4, 0, 1, 2, 3]], atol=1e-6)
    b = extract_features(encoder, images, rows=list(range(3, 10)), cache_dir=tmp_path, dataset_key=KEY)
    assert encoder.images_seen == 5 + 5  # rows 3 and 4 came from the cache
    assert torch.allclose(b, full[3:10], atol=1e-6)
    c = extract_features(encoder, images, rows=None, cache_dir=tmp_path, dataset_key=KEY)
    assert encoder.images_seen == 20 and torch.allclose(c, full, atol=1e-6)
    assert len(cache_files(tmp_path)) == 1
    extract_features(encoder, images, rows=[19, 0], cache_dir=tmp_path, dataset_key=KEY)
    assert encoder.images_seen == 20


def test_console_says_how_many_features_came_from_the_cache(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    encoder, images = CountingEncoder(), make_images(20)
    with caplog.at_level("INFO", logger="flsuite.data.feature_cache"):
        extract_features(encoder, images, rows=range(12), cache_dir=tmp_path, dataset_key=KEY)
        extract_features(encoder, images, cache_dir=tmp_path, dataset_key=KEY)
    lines = [r.getMessage() for r in caplog.records if "from cache" in r.getMessage()]
    assert [line.split(": ", 1)[1] for line in lines] == ["0 from cache, 12 extracted", "12 from cache, 8 extracted"]


def _office_config(tmp_path: Path) -> Path:
    """A two-domain Office-Caltech-10 look-alike embedded by `CountingEncoder` into a cache under `tmp_path`."""
    import numpy as np
    from PIL import Image

    from flsuite.data.folder_names import OFFICE_CALTECH10_CLASSES

    rng = np.random.default_rng(0)
    for domain in ("amazon", "webcam"):
        for cls in OFFICE_CALTECH10_CLASSES:
            (tmp_path / "office" / domain / cls).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(
                    tmp_path / "office" / domain / cls / f"{i}.png"
                )
    return _benchmark_config(tmp_path, suite="office_caltech10", root=tmp_path / "office", domains=["amazon", "webcam"])


def _benchmark_config(tmp_path: Path, root: Path, **init_args: object) -> Path:
    """`tmp_path/run.yaml`: SMALL_CONFIG on a `Benchmark` over `root` (12-pixel images) embedded by `CountingEncoder`
    into a cache under `tmp_path`."""
    import yaml

    from tests.helpers import SMALL_CONFIG

    data = {
        "class_path": "flsuite.data.benchmarks.Benchmark",
        "init_args": {
            **init_args,
            "root": str(root),
            "image_size": 12,
            "encoder": {"class_path": f"{__name__}.CountingEncoder"},
            "cache_dir": str(tmp_path / "cache"),
        },
    }
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**SMALL_CONFIG, "data": data, "output_dir": str(tmp_path / "runs")}))
    return config


def test_features_on_a_filled_cache_answer_from_its_index_without_the_encoder(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """`flsuite features` records its build in the cache's index; the same command line (before any parser) and
    another one resolving to the same data (through the parser) are then answered from the index alone: the encoder is
    never built. A touched image (mtime) or a rewritten one (size) is a miss, and the build runs again."""
    from tests.helpers import run_cli

    config = _office_config(tmp_path)
    argv = ["features", "--config", str(config)]
    code, out, _ = run_cli(argv, capsys)
    first = json.loads(out)
    assert (
        code == 0 and "already_embedded" not in first and len(list((tmp_path / "cache" / "index").glob("*.json"))) == 2
    )
    images = first["train_samples"] + first["test_samples"]

    def not_built(self, *args, **kwargs):
        raise AssertionError("the encoder was built")

    with monkeypatch.context() as patch:
        patch.setattr(CountingEncoder, "__init__", not_built)
        for args in (argv, [*argv, "--rounds", "7"]):  # the command line's own key; the resolved data's key
            code, out, err = run_cli(args, capsys)
            assert code == 0 and f"already embedded: {images:,} images, {tmp_path / 'cache'}" in err
            report = json.loads(out)
            assert report["already_embedded"] is True and report["train_samples"] == first["train_samples"]
        image = tmp_path / "office" / "webcam" / "mug" / "1.png"
        os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and "the encoder was built" in err  # (jsonargparse reports the raise as a config error)
    code, out, _ = run_cli(argv, capsys)  # the miss rebuilds (the image's bytes are unchanged: all from the cache) ...
    assert code == 0 and "already_embedded" not in json.loads(out)
    with monkeypatch.context() as patch:
        patch.setattr(CountingEncoder, "__init__", not_built)
        assert run_cli(argv, capsys)[0] == 0  # ... and records it: a hit again
        with open(image, "ab") as grown:
            grown.write(b"\0")
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and "the encoder was built" in err


def test_digits_offline_is_indexed_by_its_usps_file(tmp_path: Path, capsys, monkeypatch) -> None:
    """digits_offline (USPS from a .mat under `root`, SYN rendered by flsuite) is recorded in the index: the same
    command is answered without the encoder or the SYN renderer; a touched usps.mat is a miss."""
    import numpy as np
    import scipy.io

    from flsuite.data import syn_digits
    from tests.helpers import run_cli

    (tmp_path / "data" / "usps").mkdir(parents=True)
    usps = tmp_path / "data" / "usps" / "usps.mat"
    rng = np.random.default_rng(0)
    labels = np.arange(40).reshape(-1, 1) % 10
    pixels = {"Xtr": rng.uniform(-1, 1, (40, 256)), "Xtst": -np.ones((20, 256))}
    scipy.io.savemat(usps, {**pixels, "ytr": labels, "ytst": labels[:20]})
    config = _benchmark_config(
        tmp_path, suite="digits_offline", root=tmp_path / "data", domains=["usps", "syn"], syn_samples=[30, 20]
    )
    argv = ["features", "--config", str(config)]
    code, out, _ = run_cli(argv, capsys)
    assert code == 0 and "already_embedded" not in json.loads(out)

    def not_run(*args, **kwargs):
        raise AssertionError("built again")

    with monkeypatch.context() as patch:
        patch.setattr(CountingEncoder, "__init__", not_run)
        patch.setattr(syn_digits, "render_syn_digits", not_run)
        code, out, _ = run_cli(argv, capsys)
        assert code == 0 and json.loads(out)["already_embedded"] is True
        os.utime(usps, ns=(usps.stat().st_atime_ns, usps.stat().st_mtime_ns + 10**9))
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and "built again" in err


def test_the_index_and_the_benchmark_agree_on_the_default_cache_folder() -> None:
    import inspect

    from flsuite.data.benchmarks import Benchmark
    from flsuite.data.cache_index import DEFAULT_CACHE_DIR

    assert inspect.signature(Benchmark).parameters["cache_dir"].default == Path(DEFAULT_CACHE_DIR)
