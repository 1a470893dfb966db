"""Batched feature extraction with a frozen encoder and an on-disk cache.

Cache entries live in ``<cache_dir>/<digest>.pt`` (``{"features", "key"}``,
loaded with ``weights_only=True``) next to a human-readable ``<digest>.json``.
The digest covers the encoder's :meth:`~flsuite.models.frozen_encoder.FrozenEncoder.cache_key`,
the caller's ``dataset_key`` and a content fingerprint of the image tensor.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from flsuite import progress as console
from flsuite.data.cache_index import note_used
from flsuite.models.frozen_encoder import FrozenEncoder

__all__ = ["cache_digest", "check_cache_dir", "extract_features", "images_fingerprint"]

log = logging.getLogger(__name__)

CACHE_FORMAT = "2"


def check_cache_dir(cache_dir: str | os.PathLike[str]) -> Path:
    """Create the feature cache folder if needed and prove it writable (a probe file), before any image is embedded.

    An unusable folder (a dangling link, a file, a folder without write permission) raises `DataError` in one line
    naming the path and the fix, instead of failing after the first pool has been embedded.
    """
    from flsuite.data.base import DataError

    root = Path(cache_dir)
    fix = "set data.init_args.cache_dir to a writable folder (or null to embed without a cache)"
    if root.is_symlink() and not root.exists():
        raise DataError(f"feature cache folder {root} is a link to {os.readlink(root)}, which does not exist; {fix}")
    if root.exists() and not root.is_dir():
        raise DataError(f"feature cache folder {root} is a file, not a folder; {fix}")
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=root, prefix=".write-probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise DataError(f"feature cache folder {root} cannot be written ({err.strerror or err}); {fix}") from None
    return root


def images_fingerprint(images: Tensor) -> dict[str, str]:
    """Shape, dtype and blake2b digest of the raw bytes of an image tensor."""
    data = images.detach().cpu().contiguous()
    digest = hashlib.blake2b(digest_size=16)
    if data.numel():
        digest.update(data.reshape(-1).view(torch.uint8).numpy().data)
    return {
        "shape": "x".join(map(str, data.shape)),
        "dtype": str(data.dtype).removeprefix("torch."),
        "blake2b": digest.hexdigest(),
    }


def cache_digest(key: Mapping[str, Any]) -> str:
    """Stable hex digest of a JSON-serialisable cache key."""
    blob = json.dumps(key, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Write ``path`` via a temporary file in the same directory and ``os.replace``."""
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600 files
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _load_cached(path: Path, key: dict[str, Any], shape: tuple[int, int]) -> tuple[Tensor, Tensor] | None:
    """Return cached ``(features, done)`` if the file exists and matches ``key`` and ``shape``, else ``None``.

    ``done`` marks the rows already computed (an entry can be filled incrementally, see :func:`extract_features`).
    """
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable entry is simply recomputed
        log.warning("Feature cache %s is unreadable (%s); recomputing", path, err)
        return None
    if not isinstance(payload, dict) or payload.get("key") != key:
        log.warning("Feature cache %s has a mismatching key; recomputing", path)
        return None
    features, done = payload.get("features"), payload.get("done")
    if not isinstance(features, Tensor) or tuple(features.shape) != shape or features.dtype != torch.float32:
        got = tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__
        log.warning("Feature cache %s holds %s, expected float32 %s; recomputing", path, got, shape)
        return None
    if not isinstance(done, Tensor) or done.dtype != torch.bool or tuple(done.shape) != shape[:1]:
        log.warning("Feature cache %s has no valid row mask; recomputing", path)
        return None
    return features, done


def _compute(encoder: FrozenEncoder, images: Tensor, batch_size: int, progress: bool | None, name: str = "") -> Tensor:
    """Encode ``images`` in batches; returns float32 ``[N, D]`` on the CPU. The bar counts images (a batch's worth
    per step), so it says how many of how many are done whatever the batch size."""
    n = images.shape[0]
    out = torch.empty(n, encoder.embed_dim, dtype=torch.float32)
    device = encoder.device
    with console.bar(n, f"features {name}".strip(), "img", show=progress) as bar, torch.inference_mode():
        for start in range(0, n, batch_size):
            batch = images[start : start + batch_size].to(device, non_blocking=True)
            out[start : start + batch.shape[0]].copy_(encoder(batch))
            bar.update(batch.shape[0])
    return out


def _name(dataset_key: Mapping[str, str] | None, default: str) -> str:
    """What the log and the bar call a pool: its dataset, domain, pool and split, as far as the key says."""
    return (
        "/".join(str(v) for k, v in sorted((dataset_key or {}).items()) if k in ("dataset", "domain", "pool", "split"))
        or default
    )


def extract_features(
    encoder: FrozenEncoder,
    images: Tensor,
    *,
    rows: Sequence[int] | np.ndarray | None = None,
    batch_size: int = 256,
    cache_dir: str | os.PathLike[str] | None = None,
    dataset_key: Mapping[str, str] | None = None,
    progress: bool | None = None,
) -> Tensor:
    """Embed uint8 images ``[N, C, H, W]`` with a frozen encoder, optionally cached on disk.

    The cache entry belongs to the whole ``images`` tensor (a dataset's pool) and is filled incrementally:
    asking for ``rows`` computes only the rows not cached yet, so runs that use different subsets of one pool
    (other seeds, other client fractions) share the embeddings already computed. Every cached call is noted for the
    cache's index (`flsuite.data.cache_index.recording`).

    Args:
        encoder: Frozen encoder (its ``cache_key()`` is part of the cache key).
        images: uint8 image tensor ``[N, C, H, W]`` (C = 1 or 3), on any device.
        rows: Which rows to return (in this order); ``None`` for all.
        batch_size: Images per forward pass.
        cache_dir: Directory of the feature cache; ``None`` disables caching.
        dataset_key: Caller's description of the images, e.g. ``{"dataset": ...,
            "domain": ..., "split": ..., "transform": ...}`` (stored in the key).
        progress: Show a progress bar (on stderr) while encoding; ``None``: the run's ``progress`` setting
            (`flsuite.progress`; off outside a run).

    Returns:
        float32 features ``[len(rows) or N, encoder.embed_dim]`` on the CPU.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if images.ndim != 4:
        raise ValueError(f"expected images [N, C, H, W], got shape {tuple(images.shape)}")
    index = torch.arange(images.shape[0]) if rows is None else torch.as_tensor(np.asarray(rows), dtype=torch.long)
    if cache_dir is None:
        return _compute(encoder, images[index], batch_size, progress, _name(dataset_key, ""))

    key: dict[str, Any] = {
        "format": CACHE_FORMAT,
        "encoder": {str(k): str(v) for k, v in encoder.cache_key().items()},
        "dataset": {str(k): str(v) for k, v in (dataset_key or {}).items()},
        "images": images_fingerprint(images),
    }
    digest = cache_digest(key)
    root = Path(cache_dir)
    path = root / f"{digest}.pt"
    shape = (images.shape[0], encoder.embed_dim)

    cached = _load_cached(path, key, shape)
    if cached is None:
        features, done = torch.zeros(shape, dtype=torch.float32), torch.zeros(shape[0], dtype=torch.bool)
    else:
        features, done = cached
    missing = index[~done[index]].unique()
    name = _name(dataset_key, path.name)
    log.info(
        "features %s: %s from cache, %s extracted",
        name,
        f"{len(index) - int((~done[index]).sum()):,}",
        f"{len(missing):,}",
    )
    if len(missing) == 0:
        note_used(path, len(index))
        return features[index]

    log.info("Extracting %d features with %s -> %s", len(missing), key["encoder"]["encoder"], path)
    features[missing] = _compute(encoder, images[missing], batch_size, progress, name)
    done[missing] = True
    root.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, lambda tmp: torch.save({"features": features, "done": done, "key": key}, tmp))
    _atomic_write(
        root / f"{digest}.json",
        lambda tmp: tmp.write_text(json.dumps({"digest": digest, "key": key}, indent=2, sort_keys=True)),
    )
    note_used(path, len(index))
    return features[index]
