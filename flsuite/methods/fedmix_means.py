"""FedMix's one-shot exchange of averaged data (MAFL): what the clients compute and the server pools; the method, its
losses and its protocol (`MeanAugmentedRounds`, which runs the exchange) are `flsuite.methods.fedmix`.

Before round 1, asked once per run (`RunContext.query_once`: checkpointed, so a resumed run neither asks again nor
counts twice):
  1. `GroupMeans` ("fedmix/means"): client k shuffles its training samples (seeded by (seed, k, the query)), cuts the
     first M·⌊n_k/M⌋ into ⌊n_k/M⌋ groups of M = `mix_group` (null: one group of all n_k; a client with n_k < M sends
     one mean of all its samples) and uploads each group's mean input and mean one-hot label (float32);
  2. the server pools them in client order into X_g [G, ...], Y_g [G, C];
  3. `Delivery` ("fedmix/delivery"): the server sends X_g, Y_g to every client (the query's broadcast, counted down;
     the clients answer nothing).
The rounds then run with a copy of the method that carries X_g, Y_g: the executors ship it to the clients in the
method's read-only snapshot once per phase, which is how the simulated clients keep what step 3 sent them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from flsuite.data.base import ClientData
from flsuite.federation.query import ClientQuery, QueryOutcome, QueryTask

#: The owner of FedMix's once-only answers in the run state (`state.answers["fedmix"]`).
OWNER = "fedmix"


def group_means(
    x: torch.Tensor, y: torch.Tensor, num_classes: int, mix_group: int | None, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Means of `x` and of one-hot `y` over groups of `mix_group` samples of a seeded permutation (module docstring):
    {"x": [G, ...], "y": [G, num_classes]}, float32 (summed in float64)."""
    n = len(y)
    size = n if mix_group is None else min(mix_group, n)
    groups = n // size if n else 0
    order = torch.randperm(n, generator=generator)[: groups * size].view(groups, size)
    return {
        "x": x[order].to(torch.float64).mean(dim=1).float(),
        "y": F.one_hot(y[order], num_classes).to(torch.float64).mean(dim=1).float(),
    }


@dataclass
class GroupMeans(ClientQuery):
    """Client side of step 1: the group means of the client's training split."""

    num_classes: int
    mix_group: int | None = None

    name = "fedmix/means"

    def compute(self, client: ClientData, task: QueryTask, model: torch.nn.Module | None) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(task.seed)
        return group_means(client.train.x, client.train.y, self.num_classes, self.mix_group, generator)


class Delivery(ClientQuery):
    """Step 3: the pooled means reach every client as this query's broadcast; nothing comes back."""

    name = "fedmix/delivery"

    def compute(self, client: ClientData, task: QueryTask, model: torch.nn.Module | None) -> dict[str, Any]:
        return {}


def pool(outcome: QueryOutcome) -> dict[str, torch.Tensor]:
    """Step 2: every client's means, concatenated in client-id order."""
    uploads = outcome.uploads()
    order = sorted(uploads)
    return {key: torch.cat([uploads[k][key] for k in order]) for key in ("x", "y")}
