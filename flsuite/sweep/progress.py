"""A sweep's progress on stderr: one line per finished trial (`Progress`, an optuna callback) and its elapsed time."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from flsuite.sweep.report import fmt

if TYPE_CHECKING:
    from flsuite.sweep.study import Sweep


class Progress:
    """An optuna callback: one line on stderr per finished trial (trials done / the sweep's target, the trial's
    parameters and score, the best so far, the time since the sweep started), so a sweep is never silent for minutes."""

    def __init__(self, sweep: Sweep, target: int, done: int = 0) -> None:
        self.sweep, self.target, self.done, self.start = sweep, target, done, time.monotonic()
        self.lock = threading.Lock()  # optuna calls back from its worker threads

    def __call__(self, study: Any, trial: Any) -> None:
        with self.lock:
            self.done += 1
            done = self.done
        print(self.line(study, trial, done, time.monotonic() - self.start), file=sys.stderr, flush=True)

    def line(self, study: Any, trial: Any, done: int, seconds: float) -> str:
        state = trial.state.name
        if state == "COMPLETE":
            score = f"{self.sweep.metric} = {fmt(trial.value)}"
        elif state == "PRUNED":
            last = max(trial.intermediate_values) if trial.intermediate_values else None
            score = f"pruned at round {last}" if last is not None else "pruned"
        else:
            score = f"{state.lower()}; see {self.sweep.out / 'logs' / f'{trial.number:04d}.log'}"
        params = ", ".join(f"{k}={fmt(v)}" for k, v in trial.params.items()) or "no parameters"
        try:
            best = study.best_trial
            best_text = f"best {fmt(best.value)} (trial {best.number})"
        except ValueError:  # no complete trial yet
            best_text = "best —"
        return (
            f"sweep {self.sweep.name} [{done}/{self.target}] trial {trial.number}: "
            f"{score} | {params} | {best_text} | {duration(seconds)} elapsed"
        )


def duration(seconds: float) -> str:
    """`42s`, `3m05s`, `1h02m`."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
