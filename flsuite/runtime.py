"""Process-wide runtime tuning: glibc's allocator (`keep_freed_memory`) and torch's thread counts (`ThreadPolicy`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> bool:
    """Ask glibc to serve large blocks from the heap and not return freed memory to the OS.

    CNN forward passes allocate and free activation tensors of tens of MB per layer; by default glibc maps each with
    mmap and unmaps it on free, so every batch pays page faults. Measured on a 2-core machine, EfficientNet-Lite0 at
    224 px, batches of 64: 37 → 180 images/s, system time 8.5 s → 0.1 s per 256 images. Memory stays allocated to
    the process instead (a higher but steady RSS). No-op (returns False) where glibc's mallopt is unavailable.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1) == 1
    except (OSError, AttributeError):
        return False
    if not ok:
        log.debug("mallopt refused the thresholds; keeping glibc's defaults")
    return ok


# ---- torch threads ---------------------------------------------------------------------------------------------

#: Environment variables the thread policy reads (see `ThreadPolicy`).
THREADS_ENV, PARALLEL_ENV = "FLSUITE_THREADS", "FLSUITE_PARALLEL"

#: The last decision `ThreadPolicy.apply` made in this process (what `thread_counts` reports).
_APPLIED: dict[str, Any] = {}


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask, so `taskset` and cpusets count), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _env_count(name: str) -> int | None:
    """A positive integer from environment variable `name`, None when unset or empty; a clear error otherwise."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"environment variable {name}={value!r} must be a positive integer")
    return count


#: Forward FLOPs of a training batch that each intra-op thread needs before the policy adds it (`ThreadPolicy`;
#: measured in docs/performance.md#threads: a second thread paid 1.3-2x alone from 0.12 GFLOP per thread up, and
#: nothing for the quickstart's CNN at 0.0014).
FLOPS_PER_THREAD = 1e8


def step_flops(model: Any, input_shape: Sequence[int], batch_size: int) -> float:
    """Forward FLOPs of one batch of `batch_size` through `model` (torch's FlopCounterMode on one zero sample, in
    eval mode, without gradients; the model's mode and the global random state are left as they were)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    training = model.training
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]), FlopCounterMode(display=False) as counter:
            model(torch.zeros(1, *input_shape))
    finally:
        model.train(training)
    return float(counter.get_total_flops()) * batch_size


@dataclass(frozen=True)
class ThreadPolicy:
    """How many threads torch uses in this process; decided once per run, deterministically (bit-identical reruns
    depend on the count): from the config, the work per step and the cores, never from the machine's current load.

    Intra-op threads, first that applies:
      1. the environment variable `FLSUITE_THREADS` (an override for any config);
      2. `intra_op` when it is a number;
      3. "auto": one thread per `FLOPS_PER_THREAD` forward FLOPs of a training batch, at least 1 and at most this
         process's share of the cores but one, `(cores - 1) // FLSUITE_PARALLEL` (`FLSUITE_PARALLEL`: processes a
         launcher runs side by side; the study runner sets it; 1 when unset). One core is left to the rest of the
         machine: threads that wait for each other at every operation run 2.3-3.7x slower as soon as one other
         CPU-bound process takes one of their cores, whatever the model (measured on 2 cores), so on 2 cores every
         run gets one thread. Small models and batches (the quickstart's CNN, a head on embeddings) get one thread
         on any machine: their operations are too short to split. An `OMP_NUM_THREADS` set in the environment caps
         the automatic count (it never raises it).
    Inter-op threads: `inter_op` when a number; "auto" gives 1 (the suite runs no inter-op parallel work). torch
    accepts the inter-op count only before its first parallel work, so a later different request is logged and the
    effective count kept.

    Args:
        intra_op: torch intra-op threads (`torch.set_num_threads`): a count, or "auto".
        inter_op: torch inter-op threads (`torch.set_num_interop_threads`): a count, or "auto".
    """

    intra_op: int | Literal["auto"] = "auto"
    inter_op: int | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        for key in ("intra_op", "inter_op"):
            value = getattr(self, key)
            if value != "auto" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"threads.{key} must be a positive integer or 'auto', got {value!r}")

    def resolve(self, flops_per_step: float, cores: int | None = None, spare: int = 1) -> dict[str, Any]:
        """The thread counts for training steps of `flops_per_step` forward FLOPs (`step_flops`), and why.

        `cores`: CPUs this process may use (default: its affinity mask); `spare`: of those, how many "auto" leaves to
        the rest of the machine (a Ray worker passes the CPUs Ray reserved for it, and 0).
        """
        if (forced := _env_count(THREADS_ENV)) is not None:
            intra, source = forced, THREADS_ENV
        elif self.intra_op != "auto":
            intra, source = self.intra_op, "config"
        else:
            cores = cores or available_cores()
            parallel = _env_count(PARALLEL_ENV) or 1
            intra = max(1, min((cores - spare) // parallel, int(flops_per_step // FLOPS_PER_THREAD)))
            source = (
                f"auto ({flops_per_step / 1e9:.3g} GFLOP per step, {cores} cores, {spare} spare, {parallel} parallel)"
            )
            if (cap := _env_count("OMP_NUM_THREADS")) is not None and cap < intra:
                intra, source = cap, source + f", capped by OMP_NUM_THREADS={cap}"
        inter = 1 if self.inter_op == "auto" else self.inter_op
        return {"intra_op": intra, "inter_op": inter, "source": source}

    def apply(self, flops_per_step: float, cores: int | None = None, spare: int = 1) -> dict[str, Any]:
        """Resolve and set torch's thread counts; returns (and records for `thread_counts`) the effective ones."""
        import torch

        decision = self.resolve(flops_per_step, cores, spare)
        if torch.get_num_threads() != decision["intra_op"]:
            torch.set_num_threads(decision["intra_op"])
        if torch.get_num_interop_threads() != decision["inter_op"]:
            try:
                torch.set_num_interop_threads(decision["inter_op"])
            except RuntimeError:  # torch allows it only before its first inter-op work (e.g. a second run in-process)
                log.info(
                    "torch inter-op threads stay %d (requested %d: already in use)",
                    torch.get_num_interop_threads(),
                    decision["inter_op"],
                )
        effective = {
            "intra_op": torch.get_num_threads(),
            "inter_op": torch.get_num_interop_threads(),
            "source": decision["source"],
        }
        _APPLIED.clear()
        _APPLIED.update(effective)
        log.info(
            "torch threads: %d intra-op, %d inter-op (%s)",
            effective["intra_op"],
            effective["inter_op"],
            effective["source"],
        )
        return effective

    def describe(self) -> dict[str, Any]:
        """The effective counts of this process (see `thread_counts`)."""
        return thread_counts()


def thread_counts() -> dict[str, Any]:
    """torch's effective thread counts in this process, and the policy decision that set them (if one did)."""
    import torch

    counts: dict[str, Any] = {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
    if _APPLIED and _APPLIED["intra_op"] == counts["intra_op"]:
        counts["source"] = _APPLIED["source"]
    return counts
