"""Ctrl-C that reaches the suite's own handler.

Lightning catches `KeyboardInterrupt` inside `Trainer.fit` and calls `sys.exit(1)`, so a plain Ctrl-C during a client
fit never reaches the round loop. While `flsuite fit` runs, SIGINT instead raises `RunInterrupted`, which derives from
`BaseException` but not from `KeyboardInterrupt`: Lightning tears the client's trainer down and re-raises it, the
round loop writes the last completed round's checkpoint, and the CLI exits with status 130. A second Ctrl-C while
that happens raises a plain `KeyboardInterrupt` (the default handler is back after the first).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Exit status of an interrupted `flsuite fit` (128 + SIGINT, the shell's convention).
EXIT_INTERRUPTED = 130


class RunInterrupted(BaseException):
    """The run was interrupted (SIGINT). `run_dir` is set by the round loop once it knows the folder."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(f"interrupted by signal {signal.Signals(signum).name}")
        self.signum = signum
        self.run_dir: Path | None = None


def _raise_interrupt(signum: int, frame: object) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C is a plain KeyboardInterrupt
    raise RunInterrupted(signum)


@contextmanager
def sigint_raises_run_interrupted() -> Iterator[None]:
    """Within the block, SIGINT raises `RunInterrupted` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def note_run_dir(interrupt: BaseException, run_dir: Path) -> None:
    """Attach the run folder to an interrupt on its way out, so the CLI can say what to resume."""
    if getattr(interrupt, "run_dir", None) is None:
        interrupt.run_dir = Path(run_dir)  # type: ignore[attr-defined]
