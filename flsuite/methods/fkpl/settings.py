"""FKPL's settings, one frozen dataclass per stage, each checked where it is built: `ClusterSettings` (Stage 0: the
bases, the angle, the clustering or a fixed assignment), `ExpertSettings` (Stage I), `CalibrationSettings` (Stage II:
the virtual features, the server head or the federated-head control, the personalised heads). `FKPL` takes them flat
(its `init_args`, documented there) and builds the three with `of`; each phase takes its stage's settings only.

A bad value fails with the stage, the key, the value and what was expected, e.g.
`FKPL Stage II settings: partner must be 'one', 'other' or 'all', got 'any' ('any' is now 'one')`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, Self, get_args

Angle = Literal["exact", "pacfl"]
Linkage = Literal["average", "weighted"]
ClassBudget = Literal["floor", "counts"]
Assignment = Literal["subspace", "single", "domains"]
ExpertInit = Literal["shared", "independent"]
Head = Literal["server", "federated"]
LamOn = Literal["feature", "prototype"]
Partner = Literal["one", "other", "all"]

#: Old option values, refused with their new name.
RENAMED: dict[tuple[str, object], str] = {("partner", "any"): "one"}


def one_of(key: str, value: object, choices: Any) -> str | None:
    """None when `value` is one of the Literal `choices`, else what is wrong."""
    allowed = get_args(choices)
    if value in allowed:
        return None
    names = [repr(c) for c in allowed]
    renamed = RENAMED.get((key, value))
    hint = f" ({value!r} is now {renamed!r})" if renamed else ""
    return f"{key} must be {', '.join(names[:-1])} or {names[-1]}, got {value!r}{hint}"


def at_least(key: str, value: float | None, low: int, null: bool = False) -> str | None:
    """None when `value` >= `low` (or is None where `null` allows it), else what is wrong."""
    if (value is None and null) or (value is not None and value >= low):
        return None
    return f"{key} must be >= {low}{' or null' if null else ''}, got {value!r}"


def check(stage: str, problems: Iterable[str | None]) -> None:
    """Raise one ValueError naming every problem of a stage's settings."""
    bad = [p for p in problems if p]
    if bad:
        raise ValueError(f"FKPL {stage} settings: {'; '.join(bad)}")


class StageSettings:
    """What the three settings share: built from FKPL's flat options."""

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Self:
        """The settings from FKPL's `init_args` (every field by its name; other keys belong to other stages)."""
        return cls(**{f.name: options[f.name] for f in fields(cls)})  # type: ignore[arg-type]

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]


@dataclass(frozen=True)
class ClusterSettings(StageSettings):
    """Stage 0: client m's basis U_m (`basis` p, `per_class` with `class_budget`, Stage 0's own view of the inputs
    `stage0_size`/`stage0_augment`/`stage0_normalize`), the principal `angle`, the `linkage` at `threshold` degrees,
    or a fixed `assignment`."""

    threshold: float = 5.3
    basis: int = 10
    per_class: bool = False
    angle: Angle = "exact"
    class_budget: ClassBudget = "floor"
    linkage: Linkage = "average"
    stage0_size: int | None = None
    stage0_augment: bool = False
    stage0_normalize: bool = False
    assignment: Assignment = "subspace"

    def __post_init__(self) -> None:
        check(
            "Stage 0",
            [
                at_least("threshold", self.threshold, 0),
                at_least("basis", self.basis, 1),
                one_of("angle", self.angle, Angle),
                one_of("class_budget", self.class_budget, ClassBudget),
                one_of("linkage", self.linkage, Linkage),
                at_least("stage0_size", self.stage0_size, 1, null=True),
                one_of("assignment", self.assignment, Assignment),
            ],
        )


@dataclass(frozen=True)
class ExpertSettings(StageSettings):
    """Stage I: `expert_rounds` FedAvg rounds per cluster (null: the federation's), every expert from one draw or its
    own (`expert_init`)."""

    expert_rounds: int | None = None
    expert_init: ExpertInit = "shared"

    def __post_init__(self) -> None:
        check(
            "Stage I",
            [
                at_least("expert_rounds", self.expert_rounds, 1, null=True),
                one_of("expert_init", self.expert_init, ExpertInit),
            ],
        )


@dataclass(frozen=True)
class CalibrationSettings(StageSettings):
    """Stage II: the virtual features (λ ~ U(`a`, `b`) on the side `lam_on`, rounded to `lam_decimals`, the `partner`
    prototypes, `virtual_per_sample` passes), the `head` (the server's, SGD `head_epochs`/`head_lr`/`head_momentum`/
    `head_batch_size`, or the federated control over `head_rounds`), and the `personalized_heads`."""

    head: Head = "server"
    head_epochs: int = 200
    head_lr: float = 0.01
    head_momentum: float = 0.9
    head_batch_size: int = 64
    head_rounds: int | None = None
    a: float = 0.5
    b: float = 1.0
    lam_on: LamOn = "feature"
    lam_decimals: int | None = None
    partner: Partner = "one"
    virtual_per_sample: int = 1
    personalized_heads: bool = False

    def __post_init__(self) -> None:
        decimals = self.lam_decimals
        check(
            "Stage II",
            [
                one_of("head", self.head, Head),
                None
                if 0.0 <= self.a <= self.b <= 1.0
                else f"a and b must satisfy 0 <= a <= b <= 1, got a = {self.a}, b = {self.b}",
                one_of("lam_on", self.lam_on, LamOn),
                None
                if decimals is None or (isinstance(decimals, int) and decimals >= 0)
                else f"lam_decimals must be an integer >= 0 or null, got {decimals!r}",
                one_of("partner", self.partner, Partner),
                *(
                    at_least(key, getattr(self, key), 1)
                    for key in ("head_epochs", "head_batch_size", "virtual_per_sample")
                ),
                None if self.head_lr > 0 else f"head_lr must be > 0, got {self.head_lr!r}",
                at_least("head_rounds", self.head_rounds, 1, null=True),
            ],
        )
