"""Progress on the console: one switch per run and one kind of bar for every phase that takes more than a moment.

A run's `progress` setting (`--progress false` turns it off) covers all of its long phases, not only the rounds:
building the data (feature extraction), setup stages, client queries and server-side fits show a tqdm bar too. Every
bar goes to stderr, never into the run's files: `metrics.jsonl`, `timings.jsonl` and the others are the same with and
without progress (W&B's console capture, when on, mirrors the terminal, the round bar included, as it always has).

The switch is process-wide (`shown`), set by the run for as long as it runs, so a data source, a setup stage or a
server-side fit shows progress without being handed a flag; code outside a run (library calls, tests, Ray workers)
shows none. Engine code that holds the run's settings (rounds, client queries) passes them instead (`show=`).

A bar opened while another one is open (a server fit inside a round) is cleared when it closes; a bar of its own
stays as the phase's one-line record (tqdm's `leave=None`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

__all__ = ["bar", "shown", "track"]

T = TypeVar("T")

_shown = False


@contextlib.contextmanager
def shown(on: bool) -> Iterator[None]:
    """Show progress (or not) until the block ends; the previous setting comes back after it."""
    global _shown
    previous, _shown = _shown, bool(on)
    try:
        yield
    finally:
        _shown = previous


def bar(
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    initial: int = 0,
    leave: bool | None = None,
    show: bool | None = None,
) -> tqdm:
    """A tqdm bar on stderr, shown when `show` says so (None: when the run shows progress); use it as a context
    manager, so that it is closed on errors too."""
    return tqdm(total=total, desc=desc, unit=unit, initial=initial, leave=leave, disable=_hidden(show), file=sys.stderr)


def track(
    items: Iterable[T], desc: str, unit: str = "it", total: int | None = None, show: bool | None = None
) -> Iterable[T]:
    """`items` with a bar that counts each one when its turn is over (as `bar`: shown when the run shows progress);
    `total` for items without a length (a generator)."""
    return tqdm(items, desc=desc, unit=unit, total=total, leave=None, disable=_hidden(show), file=sys.stderr)


def _hidden(show: bool | None) -> bool:
    return not (_shown if show is None else show)
