"""Warm worker processes that run many `flsuite fit` runs each, so a study does not pay a fresh interpreter's imports
(torch, every flsuite module: 6-40 s on this project's shared 2-core machines before issue 35) for every run.

    with WarmPool(workers=2) as pool:           # from any number of threads, e.g. a ThreadPoolExecutor's
        code = pool.run(["--config", "run.yaml", "--seed", "0"], log=Path("runs/x/seed0.log"), env={...})

Built on the standard library's `concurrent.futures.ProcessPoolExecutor`, one single-worker executor per slot, its
worker started with `spawn` (a fresh interpreter, never a fork of a parent holding threads or Ray) and replaced by the
library after `runs_per_worker` runs (`max_tasks_per_child`), which bounds what a long study can accumulate. Every run
is what `flsuite fit ARGV` is in a fresh process, as far as the run can tell:

- its environment is the caller's `env` alone for the run (and restored afterwards), so `FLSUITE_PARALLEL`,
  `OMP_NUM_THREADS` or a variable a library set during the previous run (Lightning's `PL_GLOBAL_SEED`) do not leak;
- its output (fds 1 and 2: Python, C libraries and child processes alike) goes to its own log file;
- its seed streams are its own: flsuite derives every stream from the run's seeds (`flsuite.seeding`: generators of
  their own, and torch's global generator seeded from them wherever it is drawn from: model init, each client and
  server fit, each query), so what ran before in the worker does not matter (tests/test_pool.py: the same
  metrics.jsonl, byte for byte, as in a fresh process, after another run);
- its thread policy is applied as in a fresh process (`ThreadPolicy.apply` sets torch's intra-op count every run;
  the inter-op count is 1 for every run, set by the first);
- its run folder and W&B run are its own (`flsuite fit` creates and closes them).

A run that raises fails alone: the worker prints the traceback into the run's log and returns status 1 (as the
process would have). A worker that dies (killed, out of memory, a crash in C) fails only the run it held: the slot's
executor is replaced by a fresh one and `run` returns `KILLED` (the other slots, and the runs waiting for this one,
go on). What stays warm across runs is only what is the same for every run: imported modules, torch's compiled
graphs (same code, same graphs) and Python's warning registry (a warning shown once per worker, not once per run).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

__all__ = ["KILLED", "WarmPool", "run_fit_here"]

log = logging.getLogger(__name__)

#: `WarmPool.run`'s status for a run whose worker died (the shell's status of a SIGKILLed process).
KILLED = 137


def _warm_up() -> None:
    """Worker start: import what every run imports (torch, every configurable flsuite module: the parser's)."""
    from flsuite.cli_parsers import fit_parser

    fit_parser()


@contextlib.contextmanager
def _redirected(log_file: Path) -> Iterator[None]:
    """fds 1 and 2 into `log_file` for the block (what a fresh process's redirected output would hold)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "wb") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """`os.environ` is exactly `env` for the block, and what it was before afterwards."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _argv(argv: list[str]) -> Iterator[None]:
    """`sys.argv` is `argv` for the block (a run records it in environment.json)."""
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


def run_fit_here(argv: Sequence[str], log_file: str, env: Mapping[str, str]) -> int:
    """`flsuite fit ARGV` in this process, its output in `log_file`, its environment `env`, its `sys.argv` that of
    `python -m flsuite.cli fit ARGV`: its exit status (a raise anywhere is status 1, its traceback in the log)."""
    import flsuite.cli

    with _environment(env), _argv([str(flsuite.cli.__file__), "fit", *argv]), _redirected(Path(log_file)):
        try:
            from flsuite.cli import main

            return main(["fit", *argv])
        except SystemExit as done:
            return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        except BaseException:  # noqa: BLE001 - the run fails, the worker goes on (as a process would have exited 1)
            traceback.print_exc()
            return 1


class WarmPool:
    """`workers` warm processes, each running up to `runs_per_worker` runs before the library replaces it.

    `run` blocks until the run is done and may be called from several threads at once: a call waits for a free
    slot. A worker starts at the first run that finds no free slot (a study whose runs are all reused starts none).
    `task` (default `run_fit_here`) is what a slot runs; it must be importable by a spawned process. `warm`: a new
    worker imports the stack before its first run (else its first run does)."""

    def __init__(
        self, workers: int, runs_per_worker: int = 50, task: Callable[..., int] = run_fit_here, warm: bool = True
    ) -> None:
        if workers < 1 or runs_per_worker < 1:
            raise ValueError(
                f"a WarmPool needs workers >= 1 and runs_per_worker >= 1, got {workers} and {runs_per_worker}"
            )
        self.workers, self.runs_per_worker, self.task, self.warm = workers, runs_per_worker, task, warm
        self._free: queue.SimpleQueue[ProcessPoolExecutor] = queue.SimpleQueue()
        self._all: list[ProcessPoolExecutor] = []
        self._lock = threading.Lock()
        self.replaced = 0

    def _take(self) -> ProcessPoolExecutor:
        """A free slot, a new one while fewer than `workers` exist, else the next one freed."""
        with self._lock:
            if len(self._all) - self.replaced < self.workers:
                try:
                    return self._free.get_nowait()
                except queue.Empty:
                    return self._new_slot()
        return self._free.get()

    def _new_slot(self) -> ProcessPoolExecutor:
        slot = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            max_tasks_per_child=self.runs_per_worker,
            initializer=_warm_up if self.warm else None,
        )
        self._all.append(slot)
        return slot

    def run(self, *args: Any) -> int:
        """`task(*args)` in a warm worker: its status, or `KILLED` when the worker died during it (then replaced)."""
        slot = self._take()
        try:
            return int(slot.submit(self.task, *args).result())
        except BrokenProcessPool as err:
            log.warning("a pool worker died during run %s (%s); it is replaced", args[:1], err)
            slot.shutdown(wait=True, cancel_futures=True)
            with self._lock:
                slot = self._new_slot()
                self.replaced += 1
            return KILLED
        finally:
            self._free.put(slot)

    def close(self) -> None:
        for slot in self._all:
            slot.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
