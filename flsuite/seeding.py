"""Derived randomness: every random stream comes from (seed, round, client, purpose).

Results therefore do not depend on the order in which clients run or on the executor that runs them.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

#: Stands for "no client" or "no round" in a derived key (e.g. the server's sampling stream).
NONE = -1


def derive_seed(seed: int, round: int = NONE, client: int = NONE, purpose: str = "") -> int:
    """A 63-bit seed for one (seed, round, client, purpose) stream, via numpy's SeedSequence hashing."""
    key = [int(seed) & 0xFFFFFFFF, (int(round) + 1) & 0xFFFFFFFF, (int(client) + 1) & 0xFFFFFFFF, zlib.crc32(purpose.encode())]
    state = np.random.SeedSequence(key).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def numpy_rng(seed: int, round: int = NONE, client: int = NONE, purpose: str = "") -> np.random.Generator:
    """A numpy Generator for the derived stream."""
    return np.random.default_rng(derive_seed(seed, round, client, purpose))


def torch_generator(seed: int, round: int = NONE, client: int = NONE, purpose: str = "") -> torch.Generator:
    """A CPU torch.Generator for the derived stream."""
    return torch.Generator().manual_seed(derive_seed(seed, round, client, purpose))
