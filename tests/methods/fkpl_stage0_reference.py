"""Stage-0 references of the feature configs: every client's subspace basis, written once from the full run's data.

Embedding PACS with EfficientNet-Lite0 on one CPU thread takes 330-360 s (45-50 ms an image) and was the test suite's
critical path. The feature configs' test therefore clusters these committed bases and checks them against the data
the config builds: every client's rows (the partition, no embedding needed) and one client's basis recomputed from
its images through the encoder (an encoder, preprocessing or Stage-0 change moves every client's basis, so one is
enough to see it). Regenerate after such a change, from the repository root (seconds per config once the features
are cached, minutes from scratch):

    python -m tests.methods.fkpl_stage0_reference configs/fkpl/office_caltech10_effnet.yaml configs/fkpl/pacs_effnet.yaml
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

FOLDER = Path(__file__).resolve().parent / "fkpl_stage0_reference"
REGENERATE = "python -m tests.methods.fkpl_stage0_reference " + " ".join(
    f"configs/fkpl/{name}" for name in ("office_caltech10_effnet.yaml", "pacs_effnet.yaml")
)


@dataclass
class Stage0Reference:
    """A config's Stage 0 as the full run computes it: the query and seed it ran with, each client's rows and basis."""

    query: str
    seed: int
    encoder: str
    rows: list[str]
    bases: list[torch.Tensor]


def row_digests(clients: list[tuple[str, np.ndarray]]) -> list[str]:
    """Each client's (domain, rows of its domain's training pool) as a short digest: the partition, compared exactly."""
    return [
        hashlib.sha256(domain.encode() + np.asarray(rows, dtype=np.int64).tobytes()).hexdigest()[:16]
        for domain, rows in clients
    ]


def encoder_key(source) -> str:
    """The feature source's encoder as its feature cache names it (model, weights digest, preprocessing)."""
    return json.dumps(source.encoder.cache_key(), sort_keys=True, default=str)


def path_for(config: Path) -> Path:
    return FOLDER / f"{config.stem}.npz"


def load(config: Path) -> Stage0Reference:
    path = path_for(config)
    if not path.is_file():
        raise FileNotFoundError(f"no Stage-0 reference for {config.name} ({path}); write it with: {REGENERATE}")
    with np.load(path) as f:
        meta = json.loads(str(f["meta"]))
        bases = [torch.from_numpy(f[f"basis_{k}"]) for k in range(len(meta["rows"]))]
    return Stage0Reference(meta["query"], meta["seed"], meta["encoder"], meta["rows"], bases)


def write(config: Path) -> Path:
    """Build the config's data as `flsuite fit` does and save every client's Stage-0 basis (float32)."""
    from flsuite.cli import federation_from_configs
    from flsuite.methods.fkpl.subspace import client_bases

    federation = federation_from_configs(config)
    source, query = federation.data, federation.method.subspace_query()
    fed, _ = federation.build_data()
    meta = {
        "query": repr(query),
        "seed": federation.seed,
        "encoder": encoder_key(source),
        "rows": row_digests(source.layout(federation.seed).clients),
    }
    bases = {
        f"basis_{k}": b.numpy().astype(np.float32) for k, b in enumerate(client_bases(fed, query, federation.seed))
    }
    FOLDER.mkdir(exist_ok=True)
    path = path_for(config)
    np.savez_compressed(path, meta=np.array(json.dumps(meta, sort_keys=True)), **bases)
    return path


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(write(Path(name)))
