"""A validation split for any data source: every client holds out a seeded fraction of its own training split.

Decisions:
- One generic option (`validation.fraction`, a `Federation` key) applied to what `DataSource.build(seed)` returns,
  before the setup stages: no data source needs to know about it, and nothing a setup stage computes (GGEUR's
  statistics) ever sees a validation sample.
- Count: a client with n training samples holds out m = round_half_up(fraction · n) of them, exactly; fraction 0
  returns the data unchanged (the same object, no random draw), so runs without the option stay byte-identical.
- Stratified within the client: class c (n_c samples there) holds out ⌊m·n_c/n⌋, and the m − Σ⌊·⌋ samples left
  go one each to the classes with the largest remainders m·n_c mod n (ties in a seeded order). So a class with at
  least n/m samples (about 1/fraction) always gives some, a smaller class may give none: that is "enough samples".
  Which samples of a class: the first of a seeded permutation. One stream per client,
  `numpy_rng(seed, client=k, purpose="validation")`: the split does not depend on the other clients or on the
  global RNG, and the clients keep their remaining samples in their original order.
- Pooled per domain (each client's `domain`), in the order of the test domains; a domain none of whose clients
  holds anything out has no validation split.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
import torch

from flsuite.data.base import ClientData, DataError, FederatedData, Split
from flsuite.seeding import numpy_rng

log = logging.getLogger(__name__)


def held_out_per_class(labels: np.ndarray, fraction: float, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """How many samples of each class one client holds out: round_half_up(fraction · n) in all, apportioned to the
    classes by largest remainder (ties in the order of a permutation drawn from `rng`)."""
    counts = np.bincount(labels, minlength=num_classes).astype(np.int64)
    n = int(counts.sum())
    m = int(fraction * n + 0.5)
    if n == 0 or m == 0:
        return np.zeros(num_classes, dtype=np.int64)
    share, remainder = np.divmod(m * counts, n)
    tie_order = rng.permutation(num_classes)
    order = tie_order[np.argsort(-remainder[tie_order], kind="stable")]
    share[order[: m - int(share.sum())]] += 1
    return share


@dataclass(frozen=True)
class ValidationSplit:
    """A validation split held out of every client's training split (`flsuite.data.validation`).

    Args:
        fraction: Fraction of each client's training samples held out, stratified by class, in [0, 1); 0 = none.
            The held-out samples, pooled per domain, are evaluated each evaluated round as `val/` metrics.
    """

    fraction: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.fraction < 1:
            raise ValueError(f"validation.fraction must be in [0, 1), got {self.fraction}")

    def apply(self, data: FederatedData, seed: int) -> FederatedData:
        """`data` with each client's held-out samples moved to `validation` (the same object when fraction is 0)."""
        if self.fraction == 0:
            return data
        clients: list[ClientData] = []
        pooled: dict[str, list[Split]] = {}
        for c in data.clients:
            y = c.train.y.numpy()
            rng = numpy_rng(seed, client=c.client_id, purpose="validation")
            share = held_out_per_class(y, self.fraction, data.num_classes, rng)
            if len(y) and share.sum() >= len(y):
                raise DataError(
                    f"validation.fraction={self.fraction} holds out {int(share.sum())} "
                    f"of client {c.client_id}'s {len(y)} training samples (domain {c.domain!r}), "
                    "leaving it none to train on; lower validation.fraction"
                )
            held = [rng.permutation(np.flatnonzero(y == k))[:s] for k, s in enumerate(share) if s]
            mask = np.zeros(len(y), dtype=bool)
            if held:
                mask[np.concatenate(held)] = True
            clients.append(replace(c, train=c.train.subset(np.flatnonzero(~mask))))
            if mask.any():
                pooled.setdefault(c.domain, []).append(c.train.subset(np.flatnonzero(mask)))
        order = [d for d in data.test if d in pooled] + [d for d in pooled if d not in data.test]
        validation = {d: Split(torch.cat([s.x for s in pooled[d]]), torch.cat([s.y for s in pooled[d]])) for d in order}
        if missing := [d for d in data.test if d not in validation]:
            log.warning(
                "validation.fraction=%s holds out no sample of domain(s) %s (clients too small)", self.fraction, missing
            )
        return replace(data, clients=clients, validation=validation)
