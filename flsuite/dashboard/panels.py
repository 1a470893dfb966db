"""The panels a dashboard view is made of, as typed data: curves, bars, a scalar, parallel coordinates, importance."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Curves:
    """A line plot against `round`, grouped by method: the mean over seeds, ± std shaded. `regex` stands for keys
    not known yet (`acc/<domain>` before any run is read)."""

    title: str
    keys: tuple[str, ...]
    regex: str | None = None


@dataclass(frozen=True)
class Bars:
    """Summary numbers by method: one bar per method (mean over seeds, std error bars) for each key."""

    title: str
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Scalar:
    """One summary number, aggregated over the shown runs (mean, std range)."""

    title: str
    key: str


@dataclass(frozen=True)
class Parallel:
    """Parallel coordinates: the swept config keys, ending in the sweep's metric (its summary value)."""

    title: str
    config_keys: tuple[str, ...]
    metric: str


@dataclass(frozen=True)
class Importance:
    """W&B's parameter importance with respect to a metric."""

    metric: str


Panel = Curves | Bars | Scalar | Parallel | Importance
