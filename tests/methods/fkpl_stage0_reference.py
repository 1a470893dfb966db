"""Stage-0 references of the shipped FKPL configs whose Stage 0 is too slow for the test suite, written once from the
full run's data.

Feature configs: every client's subspace basis. Embedding PACS with EfficientNet-Lite0 on one CPU thread takes
330-360 s (45-50 ms an image) and was the test suite's critical path. The feature configs' test therefore clusters
these committed bases and checks them against the data the config builds: every client's rows (the partition, no
embedding needed) and the Stage-0 basis of the smallest client's first `SPOT_ROWS` images recomputed through the
encoder, against the one committed here (an encoder, preprocessing or Stage-0 change moves the basis of any set of
images, so a few are enough to see it; embedding the whole smallest client took 12 s for PACS on a cold feature cache).

Pixel configs (PACS at 128 px): a client's basis is 49,152 × 10 (2 MB), and the 20 SVDs that give them were the
slowest part of the config test. Stage 0 reads its bases only through their inner products (both angles are functions
of U_iᵀ U_j: the entrywise one directly, the exact one through the QR of each basis, fixed by U_iᵀ U_i), so the
reference keeps the bases' Gram matrix, as a factor C (CᵀC = [U_1 … U_M]ᵀ[U_1 … U_M]) whose column blocks C_i give
the same angles as the U_i; the same for the official Stage 0's bases (configs/fkpl/stage0_official.yaml). The test
checks every client's rows and recomputes two clients' bases of different domains (Stage 0's inputs, both queries):
their principal angles are the reference's.

Regenerate after such a change, from the repository root (seconds per config once the features are cached, minutes
from scratch):

    python -m tests.methods.fkpl_stage0_reference configs/fkpl/office_caltech10_effnet.yaml \
        configs/fkpl/pacs_effnet.yaml configs/fkpl/pacs_resnet18.yaml
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

FOLDER = Path(__file__).resolve().parent / "fkpl_stage0_reference"
REGENERATE = "python -m tests.methods.fkpl_stage0_reference " + " ".join(
    f"configs/fkpl/{name}" for name in ("office_caltech10_effnet.yaml", "pacs_effnet.yaml", "pacs_resnet18.yaml")
)
#: How many of the smallest client's images a feature config's reference holds the Stage-0 basis of (the spot check).
SPOT_ROWS = 24
#: The overlay whose Stage 0 a pixel reference also holds.
OFFICIAL = Path(__file__).resolve().parents[2] / "configs" / "fkpl" / "stage0_official.yaml"


@dataclass
class Stage0Reference:
    """A config's Stage 0 as the full run computes it: the query and seed it ran with, each client's rows and basis."""

    query: str
    seed: int
    encoder: str
    rows: list[str]
    bases: list[torch.Tensor]
    spot: tuple[int, int]  # the spot check's client and how many of its first rows
    spot_basis: torch.Tensor  # their Stage-0 basis


@dataclass
class GramReference:
    """A pixel config's Stage 0 as the full run computes it, for the config's query and the official one: the queries
    and seed, the pixels' key, each client's rows, and the bases' Gram factors (module docstring)."""

    query: str
    official_query: str
    seed: int
    pixels: str
    rows: list[str]
    bases: list[torch.Tensor]  # the factor's column blocks: the clients' bases up to an isometry
    official_bases: list[torch.Tensor]


def gram_factor(bases: list[torch.Tensor]) -> np.ndarray:
    """C with CᵀC = BᵀB for B = [U_1 … U_M] (float64, rank × total columns)."""
    b = torch.cat([u.double() for u in bases], dim=1)
    values, vectors = torch.linalg.eigh(b.T @ b)
    keep = values > values.max() * 1e-12
    return (values[keep].sqrt()[:, None] * vectors[:, keep].T).numpy()


def factor_blocks(factor: np.ndarray, widths: list[int]) -> list[torch.Tensor]:
    """The column blocks of a Gram factor, one per client (`widths`: each basis's number of columns)."""
    return [torch.from_numpy(block) for block in np.split(factor, np.cumsum(widths)[:-1], axis=1)]


def pixels_key(source) -> str:
    """What a pixel config's Stage-0 inputs are besides the images and the code: suite, image size, channels."""
    return json.dumps(
        {"suite": source.suite, "image_size": source.image_size, "channels": source.channels}, sort_keys=True
    )


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


def exists(config: Path) -> bool:
    return path_for(config).is_file()


def load(config: Path) -> Stage0Reference | GramReference:
    path = path_for(config)
    if not path.is_file():
        raise FileNotFoundError(f"no Stage-0 reference for {config.name} ({path}); write it with: {REGENERATE}")
    with np.load(path) as f:
        meta = json.loads(str(f["meta"]))
        if "pixels" in meta:
            bases, official = (factor_blocks(f[name], meta[f"{name}_widths"]) for name in ("factor", "official_factor"))
            return GramReference(
                meta["query"], meta["official_query"], meta["seed"], meta["pixels"], meta["rows"], bases, official
            )
        bases = [torch.from_numpy(f[f"basis_{k}"]) for k in range(len(meta["rows"]))]
        spot_basis = torch.from_numpy(f["spot_basis"])
    return Stage0Reference(
        meta["query"], meta["seed"], meta["encoder"], meta["rows"], bases, tuple(meta["spot"]), spot_basis
    )


def spot_layout(layout, rows: int):
    """The smallest client's first `rows` rows, as the layout of a one-client benchmark (for `client_split(…, 0)`);
    and that client's index in `layout`."""
    k = min(range(len(layout.clients)), key=lambda i: len(layout.clients[i][1]))
    domain, held = layout.clients[k]
    return dataclasses.replace(layout, clients=[(domain, held[:rows])]), k


def write(config: Path) -> Path:
    """Build the config's data as `flsuite fit` does and save every client's Stage-0 basis (float32)."""
    from flsuite.cli import federation_from_configs
    from flsuite.methods.fkpl.subspace import client_bases

    federation = federation_from_configs(config)
    source, query = federation.data, federation.method.subspace_query()
    fed, _ = federation.build_data()
    if source.encoder is None:
        return write_gram(config, federation, fed)
    from flsuite.data.base import ClientData
    from flsuite.methods.fkpl.subspace import client_basis

    layout = source.layout(federation.seed)
    spot, k = spot_layout(layout, SPOT_ROWS)
    meta = {
        "query": repr(query),
        "seed": federation.seed,
        "encoder": encoder_key(source),
        "rows": row_digests(layout.clients),
        "spot": [k, SPOT_ROWS],
    }
    bases = {
        f"basis_{k}": b.numpy().astype(np.float32) for k, b in enumerate(client_bases(fed, query, federation.seed))
    }
    bases["spot_basis"] = (
        client_basis(ClientData(k, spot.clients[0][0], source.client_split(spot, 0)), query, federation.seed)
        .numpy()
        .astype(np.float32)
    )
    FOLDER.mkdir(exist_ok=True)
    path = path_for(config)
    np.savez_compressed(path, meta=np.array(json.dumps(meta, sort_keys=True)), **bases)
    return path


def write_gram(config: Path, federation, fed) -> Path:
    """A pixel config's reference (module docstring): its bases' and its official Stage 0's bases' Gram factors."""
    from flsuite.cli import federation_from_configs
    from flsuite.methods.fkpl.subspace import client_bases

    source, seed = federation.data, federation.seed
    queries = {
        "factor": federation.method.subspace_query(),
        "official_factor": federation_from_configs(config, OFFICIAL).method.subspace_query(),
    }
    meta: dict = {
        "query": repr(queries["factor"]),
        "official_query": repr(queries["official_factor"]),
        "seed": seed,
        "pixels": pixels_key(source),
    }
    meta["rows"] = row_digests(source.layout(seed).clients)
    factors = {}
    for name, query in queries.items():
        bases = client_bases(fed, query, seed)
        meta[f"{name}_widths"] = [int(b.shape[1]) for b in bases]
        factors[name] = gram_factor(bases)
    FOLDER.mkdir(exist_ok=True)
    path = path_for(config)
    np.savez_compressed(path, meta=np.array(json.dumps(meta, sort_keys=True)), **factors)
    return path


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(write(Path(name)))
