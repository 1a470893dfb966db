"""`local.loop: auto` (the default): which loop a run's client fits take, decided once per run from the config and
the federation's size, logged in one line and recorded in the run folder's `environment.json` (`local_loop`).

    compiled  for heads on feature vectors with plain SGD, 32-bit, a method without step hooks, and enough local
              steps per process to pay the one-off compilation (`COMPILE_PAYS_FROM_STEPS`);
    standard  with mixed precision (the only loop that runs it);
    lean      otherwise: image models, Adam/AdamW or step hooks (the compiled path would step one batch per call,
              no faster than lean), a client that declares its compiled loss slower (`ClientModule.compiled_pays`),
              and short runs such as the quickstart's, where compiling costs more than it saves.

Measured reasons: docs/performance.md ("local.loop: auto"). A fit outside a run (`run_client` on its own) has no
run to amortise a compilation over and takes `lean`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from flsuite.federation.task import LocalTraining, Loop

#: Local steps one process must run before compiling pays: the compiled loop saves ~0.12 ms a step on a
#: Linear(1280, 10) head at batch 16, and compiling costs 4.6 s (inductor's on-disk cache filled) to 13 s (empty)
#: once per process (docs/performance.md), so it breaks even between ~40,000 and ~110,000 steps.
COMPILE_PAYS_FROM_STEPS = 50_000


@dataclass(frozen=True)
class LoopChoice:
    """The loop chosen (`loop`), why (`reason`), and from what (`requested`: the config's `local.loop`)."""

    loop: Loop
    reason: str
    requested: Loop

    def log_line(self) -> str:
        return f"local.loop {self.requested} -> {self.loop}: {self.reason}"

    def as_record(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def steps_per_fit(local: LocalTraining, num_samples: int) -> int:
    """The optimiser steps of one client fit on `num_samples` samples (`flsuite.federation.local.batches`)."""
    if local.steps is not None:
        return local.steps
    per_epoch = num_samples // local.batch_size if local.drop_last else math.ceil(num_samples / local.batch_size)
    return local.epochs * per_epoch


def choose_loop(
    local: LocalTraining,
    input_shape: Sequence[int],
    step_hooks: bool,
    client_sizes: Sequence[int],
    clients_per_round: int,
    rounds: int,
    processes: int,
    compiled_pays: bool = True,
) -> LoopChoice:
    """The loop for `local.loop` (see the module docstring); the run's local steps per process are estimated as
    rounds × clients per round × the mean client's steps per fit / the processes that run client fits."""
    requested = local.loop
    if requested != "auto":
        return LoopChoice(requested, "set in the config", requested)

    def lean(reason: str) -> LoopChoice:
        return LoopChoice("lean", reason, requested)

    if local.precision != "32-true":
        return LoopChoice(
            "standard", f"local.precision {local.precision} (mixed precision runs on the standard loop only)", requested
        )
    if len(input_shape) > 1:
        return lean(
            f"inputs of shape {tuple(input_shape)} are images (the compiled path is for heads on feature vectors)"
        )
    if local.optimizer != "sgd":
        return lean(f"local.optimizer {local.optimizer} (the compiled path scans plain SGD's steps only)")
    if step_hooks:
        return lean("the method's client has step hooks (nothing to scan between them)")
    if not compiled_pays:
        return lean("the method's client trains faster on the lean loop (its ClientModule.compiled_pays)")
    mean_steps = sum(steps_per_fit(local, n) for n in client_sizes) / max(len(client_sizes), 1)
    steps = round(rounds * clients_per_round * mean_steps / max(processes, 1))
    if steps < COMPILE_PAYS_FROM_STEPS:
        return lean(
            f"~{steps:,} local steps per process, fewer than the {COMPILE_PAYS_FROM_STEPS:,} that pay a compilation"
        )
    return LoopChoice(
        "compiled",
        f"a head on feature vectors, plain SGD, ~{steps:,} local steps per process (>= {COMPILE_PAYS_FROM_STEPS:,})",
        requested,
    )


def resolved(local: LocalTraining, choice: LoopChoice) -> LocalTraining:
    """`local` with its loop as chosen."""
    return local if local.loop == choice.loop else dataclasses.replace(local, loop=choice.loop)


def outside_a_run(local: LocalTraining) -> LocalTraining:
    """`local` for a client fit outside a run: `auto` is `standard` with mixed precision, else `lean`."""
    if local.loop != "auto":
        return local
    return dataclasses.replace(local, loop="lean" if local.precision == "32-true" else "standard")
