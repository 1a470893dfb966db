"""Derived randomness: every random stream comes from (seed, round, client, purpose).

Results therefore do not depend on the order in which clients run or on the executor that runs them. A run has two
seeds (`Seeds`): the data seed keys the streams that draw the clients' data, the training seed every other stream.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

#: Stands for "no client" or "no round" in a derived key (e.g. the server's sampling stream).
NONE = -1


def derive_seed(seed: int, round: int = NONE, client: int = NONE, purpose: str = "") -> int:
    """A 63-bit seed for one (seed, round, client, purpose) stream, via numpy's SeedSequence hashing."""
    key = [
        int(seed) & 0xFFFFFFFF,
        (int(round) + 1) & 0xFFFFFFFF,
        (int(client) + 1) & 0xFFFFFFFF,
        zlib.crc32(purpose.encode()),
    ]
    state = np.random.SeedSequence(key).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def numpy_rng(seed: int, round: int = NONE, client: int = NONE, purpose: str = "") -> np.random.Generator:
    """A numpy Generator for the derived stream."""
    return np.random.default_rng(derive_seed(seed, round, client, purpose))


def torch_generator(seed: int, round: int = NONE, client: int = NONE, purpose: str = "") -> torch.Generator:
    """A CPU torch.Generator for the derived stream."""
    import torch  # here, so that readers of run folders (flsuite compare) import this module without torch

    return torch.Generator().manual_seed(derive_seed(seed, round, client, purpose))


def seed_torch(seed: int) -> None:
    """`torch.manual_seed(seed)`: torch's global CPU generator and, where this machine has an accelerator, its
    generators. On a machine without one only the CPU's is seeded, to the same stream: torch's call also queues a lazy
    seeding of CUDA, XPU and MTIA there, formatting the caller's stack each time, for devices that can never start (a
    cost in every client fit: docs/performance.md, "Small clients")."""
    import torch

    if _has_accelerator():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(int(seed))


@functools.cache
def _has_accelerator() -> bool:
    """Whether torch sees an accelerator (CUDA, MPS, XPU, MTIA, a registered backend); before torch 2.6, which has no
    `torch.accelerator`, assumed."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    return accelerator is None or bool(accelerator.is_available())


#: Seeds are used modulo 2**32 (`derive_seed` keeps their low 32 bits), so a seed must lie in [0, SEED_LIMIT).
SEED_LIMIT = 2**32


@dataclass(frozen=True)
class Seeds:
    """A run's two seeds (decision, issue 38): the *data* seed draws the clients — the partition, the seeded subsets
    and test splits, the validation split, server-held (guiding/public) data and its subsets; the *training* seed
    draws what is trained on them — the model's initialisation, client sampling, batch order and augmentation, client
    queries and setup stages (e.g. GGEUR's generated features), and the server's streams. `seed` sets both, so a run
    given only `seed` draws every stream exactly as before the split; `data_seed` / `train_seed` override one each."""

    data: int
    train: int

    def label(self, seed: int) -> str:
        """The run folder's seed part: `seed<seed>`, plus `-data<d>` / `-train<t>` for each seed that overrides it."""
        return (
            f"seed{seed}"
            + (f"-data{self.data}" if self.data != seed else "")
            + (f"-train{self.train}" if self.train != seed else "")
        )

    def as_record(self) -> dict[str, int]:
        return {"data_seed": self.data, "train_seed": self.train}


def label_key(name: str) -> tuple[int, str]:
    """A seed folder's name (`Seeds.label`) as a key that pairs runs and sorts by seed: `seed3` -> (3, ""),
    `seed3-train1` -> (3, "train1"); readers pair a variant's runs with another's by it."""
    seed, _, overrides = name.removeprefix("seed").partition("-")
    return int(seed), overrides


def check_seed(key: str, value: object) -> int:
    """`value` as a seed, or a ValueError naming `key`, what was expected and the fix."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= int(value) < SEED_LIMIT:
        raise ValueError(
            f"{key} must be an integer in [0, 2**32) (derived streams use a seed's low 32 bits, so larger or negative "
            f"values would repeat another seed's streams), got {value!r}; set {key} to e.g. 0"
        )
    return int(value)


def resolve_seeds(seed: int, data_seed: int | None = None, train_seed: int | None = None) -> Seeds:
    """The run's seeds from its config (`Seeds`): `data_seed` / `train_seed` when set, else `seed`; each checked."""
    seed = check_seed("seed", seed)
    data = seed if data_seed is None else check_seed("data_seed", data_seed)
    train = seed if train_seed is None else check_seed("train_seed", train_seed)
    return Seeds(data, train)


def config_seeds(config: Mapping[str, Any]) -> Seeds | None:
    """The seeds a resolved run config (config.yaml) ran with, by `resolve_seeds`'s rule, unchecked (a run folder
    written before the split has only `seed`); None when it records no seed."""
    seed = config.get("seed")
    if seed is None:
        return None
    data, train = config.get("data_seed"), config.get("train_seed")
    return Seeds(int(seed) if data is None else int(data), int(seed) if train is None else int(train))
