"""FKPL's cost per stage (Tables 9–10): what each stage sent, as typed values, and the table Stage II assembles from
them. The counts go into Stage II's record, the wall times into its timing (so a resumed run's records equal an
uninterrupted one's), all of them into setup.json and the summary under `fkpl/` (keys: `flsuite.records`).

- `ClusterCost` (Stage 0): the bases' bytes and float scalars up, the seconds of their exchange and of the clustering;
  Stage 0 writes it into its own record and timing (`record`, `timing`) and Stage II reads it back (`read`).
- `ExpertCost` (Stage I): the experts' round traffic, their parameter counts, the rounds and their seconds, from the
  round records the engine wrote under each expert's prefix.
- `EncoderCost` and `CalibrationCost` (Stage II): F sent to every client once; the prototype and virtual-feature
  exchanges and the head fit (the server head only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flsuite import records
from flsuite.federation.task import Weights
from flsuite.federation.weights import num_bytes

Counts = dict[str, int | list[int]]


def scalars(obj: Any) -> int:
    """Floating-point scalars in a payload (Table 9 counts scalars; labels and indices are not counted)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() if torch.is_floating_point(obj) else 0
    if isinstance(obj, dict):
        return sum(scalars(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(scalars(v) for v in obj)
    return 0


@dataclass(frozen=True)
class ClusterCost:
    """Stage 0: U_m up (bytes, float scalars), the exchange's and the clustering's wall seconds."""

    bytes_up: int
    scalars_up: int
    preprocess_s: float
    cluster_s: float

    def record(self) -> dict[str, int]:
        """Stage 0's record part."""
        return {**records.traffic(up=self.bytes_up), records.SCALARS_UP: self.scalars_up}

    def timing(self) -> dict[str, float]:
        """Stage 0's timing part."""
        return {records.FKPL_PREPROCESS_SECONDS: self.preprocess_s, records.FKPL_CLUSTER_SECONDS: self.cluster_s}

    @classmethod
    def read(cls, record: Mapping[str, Any], timing: Mapping[str, Any]) -> ClusterCost:
        """`record` and `timing` undone (Stage 0's committed record and timing)."""
        seconds = (timing[records.FKPL_PREPROCESS_SECONDS], timing[records.FKPL_CLUSTER_SECONDS])
        return cls(record[records.BYTES_UP], record[records.SCALARS_UP], *seconds)

    def counts(self) -> Counts:
        return {records.FKPL_STAGE0_BYTES_UP: self.bytes_up, records.FKPL_STAGE0_SCALARS_UP: self.scalars_up}

    def times(self) -> dict[str, float]:
        return {
            records.FKPL_STAGE0_PREPROCESS_SECONDS: self.preprocess_s,
            records.FKPL_STAGE0_CLUSTER_SECONDS: self.cluster_s,
        }


@dataclass(frozen=True)
class ExpertCost:
    """Stage I: every expert round's bytes each way, each expert's float scalars, the rounds, their wall seconds."""

    bytes_up: int
    bytes_down: int
    scalars_per_expert: list[int]
    rounds: int
    seconds: float

    @classmethod
    def of(
        cls, rounds: Sequence[Mapping[str, Any]], timings: Sequence[Mapping[str, Any]], weights: Sequence[Weights]
    ) -> ExpertCost:
        """From the experts' round records and timings under the plain names (`records.without_prefix`)."""
        return cls(
            bytes_up=sum(r[records.BYTES_UP] for r in rounds),
            bytes_down=sum(r[records.BYTES_DOWN] for r in rounds),
            scalars_per_expert=[scalars(w) for w in weights],
            rounds=len({r[records.ROUND] for r in rounds}),
            seconds=sum(t[records.ROUND_SECONDS] for t in timings),
        )

    def counts(self) -> Counts:
        return {
            records.FKPL_STAGE1_BYTES_UP: self.bytes_up,
            records.FKPL_STAGE1_BYTES_DOWN: self.bytes_down,
            records.FKPL_STAGE1_SCALARS_PER_EXPERT: self.scalars_per_expert,
            records.FKPL_STAGE1_ROUNDS: self.rounds,
        }

    def times(self) -> dict[str, float]:
        return {records.FKPL_STAGE1_SECONDS: self.seconds}


@dataclass(frozen=True)
class EncoderCost:
    """Stage II: F (M·V·P_f) sent to each of the M clients once (a client keeps the weights a query sent it)."""

    bytes_down: int
    scalars_down: int

    @classmethod
    def of(cls, clients: int, encoder: Weights) -> EncoderCost:
        return cls(clients * num_bytes(encoder), clients * scalars(encoder))

    def counts(self) -> Counts:
        return {records.FKPL_ENCODER_BYTES_DOWN: self.bytes_down, records.FKPL_ENCODER_SCALARS_DOWN: self.scalars_down}

    def times(self) -> dict[str, float]:
        return {}


@dataclass(frozen=True)
class CalibrationCost:
    """Stage II with the server head: the local prototypes up, the domain prototypes down, the virtual features up (and
    how many), both exchanges' bytes, and the wall seconds of the two exchanges and the head fit."""

    prototype_scalars_up: int
    domain_prototype_scalars_down: int
    virtual_scalars_up: int
    num_virtual: int
    bytes_up: int
    bytes_down: int
    prototypes_s: float
    virtual_s: float
    head_fit_s: float

    def counts(self) -> Counts:
        return {
            records.FKPL_PROTOTYPE_SCALARS_UP: self.prototype_scalars_up,
            records.FKPL_DOMAIN_PROTOTYPE_SCALARS_DOWN: self.domain_prototype_scalars_down,
            records.FKPL_VIRTUAL_SCALARS_UP: self.virtual_scalars_up,
            records.FKPL_NUM_VIRTUAL: self.num_virtual,
            records.FKPL_STAGE2_BYTES_UP: self.bytes_up,
            records.FKPL_STAGE2_BYTES_DOWN: self.bytes_down,
        }

    def times(self) -> dict[str, float]:
        return {
            records.FKPL_PROTOTYPES_SECONDS: self.prototypes_s,
            records.FKPL_VIRTUAL_SECONDS: self.virtual_s,
            records.FKPL_HEAD_FIT_SECONDS: self.head_fit_s,
        }


@dataclass(frozen=True)
class CostTable:
    """Tables 9–10: every stage's cost, in stage order (`calibration`: none under the federated head)."""

    stage0: ClusterCost
    stage1: ExpertCost
    encoder: EncoderCost
    calibration: CalibrationCost | None = None

    def parts(self) -> list[ClusterCost | ExpertCost | EncoderCost | CalibrationCost]:
        return [p for p in (self.stage0, self.stage1, self.encoder, self.calibration) if p is not None]

    def counts(self) -> Counts:
        """For Stage II's record."""
        return {k: v for part in self.parts() for k, v in part.counts().items()}

    def times(self) -> dict[str, float]:
        """For Stage II's timing."""
        return {k: v for part in self.parts() for k, v in part.times().items()}

    def setup(self) -> dict[str, Any]:
        """For setup.json and the W&B summary: each stage's counts and times, under `fkpl/`."""
        return {
            f"{records.FKPL_SUMMARY_PREFIX}{k}": v
            for part in self.parts()
            for k, v in {**part.counts(), **part.times()}.items()
        }


def cost_summary(record: Mapping[str, Any]) -> dict[str, Any]:
    """The cost table's counts in Stage II's record, under `fkpl/` (summary.json; wall times: timings.jsonl)."""
    return {
        f"{records.FKPL_SUMMARY_PREFIX}{k}": v for k, v in record.items() if k.startswith(records.FKPL_STAGE_PREFIXES)
    }
