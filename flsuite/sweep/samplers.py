"""Samplers and pruners for a checked sweep spec, and the parameters a trial draws.

Only optuna's public API is used. Where optuna's own GridSampler reaches into the study's storage (`study._storage`,
`study._study_id`, `trial._trial_id`), the locked grid sampler goes through the storage the sweep creates (an
`optuna.storages.RDBStorage`, whose methods are the documented storage interface), finding the study and trial ids
by the study's name and the trial's number.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any

from flsuite.sweep.spec import distribution


def same_grid(recorded: Mapping[str, Sequence[Any]], space: Mapping[str, Sequence[Any]]) -> bool:
    """Whether a trial's recorded `search_space` is this grid (GridSampler's test: same names, same values in the
    same order, NaN equal to NaN)."""

    def nan(v: Any) -> bool:
        return isinstance(v, Real) and math.isnan(float(v))

    return set(recorded) == set(space) and all(
        len(recorded[k]) == len(space[k]) and all(a == b or (nan(a) and nan(b)) for a, b in zip(recorded[k], space[k]))
        for k in recorded
    )


def grid_sampler(space: Mapping[str, Sequence[Any]], seed: int, storage: Any = None):
    """optuna's GridSampler, with grid points handed out one at a time under a lock.

    GridSampler gives trial n < grid size the point n and picks later trials' points at random among those not yet
    taken; with `--workers 2` a trial created before its neighbour had its point could draw the same one (measured:
    0.1 twice, 0.2 never, in 2 of 5 runs). Here a new trial takes the first point (in the seeded shuffled order) that
    no trial holds, read and written under one lock; `flsuite sweep`'s lock file keeps a study to one process.
    The points are read and recorded (the trial's `grid_id` and `search_space` system attributes, which
    GridSampler samples from) through `storage`, the storage the study is created with; without it the sampler only
    describes the grid."""
    import optuna
    from optuna.trial import TrialState

    ordered = {name: list(values) for name, values in sorted(space.items())}  # GridSampler's order of the names
    n_points = math.prod(len(values) for values in ordered.values())

    class LockedGridSampler(optuna.samplers.GridSampler):
        handout = threading.Lock()

        def before_trial(self, study, trial):
            if "grid_id" in trial.system_attrs or "fixed_params" in trial.system_attrs:
                return  # a re-queued trial keeps its point
            if storage is None:
                raise RuntimeError("grid_sampler(storage=None) cannot hand out grid points; pass the study's storage")
            with self.handout:
                study_id = storage.get_study_id_from_name(study.study_name)
                held = {
                    t.system_attrs["grid_id"]
                    for t in storage.get_all_trials(study_id, deepcopy=False)
                    if "grid_id" in t.system_attrs
                    and same_grid(t.system_attrs["search_space"], ordered)
                    and (t.state != TrialState.FAIL or not t.user_attrs.get("interrupted"))
                }
                free = [g for g in range(n_points) if g not in held]
                if not free:  # every point done or running: optuna's behaviour (re-evaluate one, then stop)
                    return super().before_trial(study, trial)
                trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
                storage.set_trial_system_attr(trial_id, "search_space", ordered)
                storage.set_trial_system_attr(trial_id, "grid_id", free[0])

    return LockedGridSampler(dict(space), seed=seed)


def sampler_for(cfg: Mapping[str, Any], seed: int, storage: Any = None):
    """The sampler of the file's `method`, seeded; a grid sampler hands out its points through `storage`."""
    import optuna

    if cfg["method"] == "grid":
        return grid_sampler({k: s["values"] for k, s in cfg["parameters"].items() if "values" in s}, seed, storage)
    if cfg["method"] == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def pruner_for(cfg: Mapping[str, Any]):
    import optuna

    early = cfg.get("early_terminate")
    if not early:
        return optuna.pruners.NopPruner()
    return optuna.pruners.HyperbandPruner(
        min_resource=early.get("min_iter", 1),
        max_resource=early.get("max_iter", "auto"),
        reduction_factor=early.get("eta", 3),
    )


def suggest(trial: Any, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """One trial's parameter values, in the file's order (constants included)."""
    params = {}
    for name, spec in cfg["parameters"].items():
        dist = distribution(name, spec)
        if dist == "constant":
            params[name] = spec["value"]
        elif dist == "categorical":
            params[name] = trial.suggest_categorical(name, spec["values"])
        elif dist == "int_uniform":
            params[name] = trial.suggest_int(name, spec["min"], spec["max"])
        elif dist == "q_uniform":
            params[name] = trial.suggest_float(name, spec["min"], spec["max"], step=spec.get("q", 1.0))
        else:
            params[name] = trial.suggest_float(name, spec["min"], spec["max"], log=dist == "log_uniform_values")
    return params
