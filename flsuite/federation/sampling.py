"""Which clients train in each round: a seeded draw per round, without replacement."""

from __future__ import annotations

from dataclasses import dataclass

from flsuite.seeding import numpy_rng


@dataclass
class ClientSampling:
    """Which clients train in each round (a seeded draw per round, without replacement).

    Args:
        fraction: Fraction of all clients sampled per round (at least one); 1.0 = full participation.
        per_round: Exact number of clients per round; overrides `fraction` when set.
    """

    fraction: float = 1.0
    per_round: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ValueError(f"sampling.fraction must be in (0, 1], got {self.fraction}")
        if self.per_round is not None and self.per_round < 1:
            raise ValueError(f"sampling.per_round must be >= 1, got {self.per_round}")

    def clients_per_round(self, num_clients: int) -> int:
        """How many of `num_clients` clients each round samples."""
        return self.per_round if self.per_round is not None else max(1, round_half_up(self.fraction * num_clients))

    def sample(self, num_clients: int, seed: int, round: int) -> list[int]:
        m = self.clients_per_round(num_clients)
        if m > num_clients:
            raise ValueError(f"sampling.per_round={m} but the federation has only {num_clients} clients")
        if m == num_clients:
            return list(range(num_clients))
        rng = numpy_rng(seed, round, purpose="sampling")
        return sorted(int(k) for k in rng.choice(num_clients, size=m, replace=False))


def round_half_up(x: float) -> int:
    return int(x + 0.5)
