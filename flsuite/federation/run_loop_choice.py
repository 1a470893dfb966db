"""Which local loop a run trains with: `local.loop` decided once per run, kept in its checkpointed state on resume."""

from __future__ import annotations

import logging
from typing import Protocol

import yaml

from flsuite.data.base import FederatedData
from flsuite.federation.executors import Executor
from flsuite.federation.local.choice import LoopChoice, choose_loop
from flsuite.federation.method import Method
from flsuite.federation.sampling import ClientSampling
from flsuite.federation.state import FederationState
from flsuite.federation.task import LocalTraining

log = logging.getLogger("flsuite.federation.run")  # the run's logger: the choice is a line of the run's log


class LoopRun(Protocol):
    """What the choice reads of its run (`flsuite.federation.run.Federation` is one)."""

    local: LocalTraining
    method: Method
    sampling: ClientSampling
    rounds: int
    executor: Executor


def run_loop_choice(federation: LoopRun, fed: FederatedData, state: FederationState) -> LoopChoice:
    """`local.loop` decided for this run (`flsuite.federation.local.choice`), logged; kept in the checkpointed
    state (`state.local_loop`), so a resumed run trains with the loop it started with."""
    if state.local_loop is not None:
        choice = state.local_loop
    elif state.history and federation.local.loop == "auto":  # resuming a run begun before `auto` (checkpoint format 3)
        began = ((yaml.safe_load(state.config_yaml or "") or {}).get("local") or {}).get(
            "loop", "lean"
        )  # lean: the old default
        choice = LoopChoice(began, "the loop this resumed run began with (before local.loop auto)", "auto")
    else:
        choice = choose_loop(
            federation.local,
            fed.input_shape,
            federation.method.client_module.step_hooks,
            [len(c.train) for c in fed.clients],
            federation.sampling.clients_per_round(len(fed.clients)),
            federation.rounds,
            federation.executor.processes,
            compiled_pays=federation.method.client_module.compiled_pays,
        )
    state.local_loop = choice
    log.info("%s", choice.log_line())
    return choice
