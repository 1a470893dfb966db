"""Small federations for tests: fast, offline, W&B off, no progress bar."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
import yaml

from flsuite.data.builtin import GaussianFeatures, UCIDigitsDomains
from flsuite.federation.method import ClientModule
from flsuite.federation.run import Federation
from flsuite.federation.task import LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.models.heads import Linear, SmallCNN
from flsuite.tracking import WandbConfig


def head_federation(run_dir: Path, **overrides: Any) -> Federation:
    """A linear head over Gaussian features: 2 domains × 2 clients."""
    kwargs: dict[str, Any] = dict(
        data=GaussianFeatures(
            dim=8, num_classes=3, num_domains=2, clients_per_domain=2, samples_per_client=60, test_per_domain=60
        ),
        model=Linear(),
        rounds=3,
        seed=7,
        local=LocalTraining(epochs=2, batch_size=16, lr=0.05),
        run_dir=run_dir,
        progress=False,
        wandb=WandbConfig(enabled=False),
    )
    kwargs.update(overrides)
    return Federation(**kwargs)


def cnn_federation(run_dir: Path, **overrides: Any) -> Federation:
    """A small CNN over the quickstart digits: 4 domains × 1 client, few samples."""
    kwargs: dict[str, Any] = dict(
        data=UCIDigitsDomains(domains=("clean", "inverted"), clients_per_domain=2, beta=0.5),
        model=SmallCNN(channels=(4, 8), hidden=16),
        rounds=3,
        seed=3,
        local=LocalTraining(epochs=1, batch_size=32, lr=0.05),
        run_dir=run_dir,
        progress=False,
        wandb=WandbConfig(enabled=False),
    )
    kwargs.update(overrides)
    return Federation(**kwargs)


class Exploding(ClientModule):
    """Client 0 returns NaN weights in round 2 (a diverged client)."""

    def end(self, fit):
        if self.task.client_id == 0 and self.task.round == 2:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))


class ExplodingFedAvg(FedAvg):
    """FedAvg whose client 0 diverges in round 2."""

    client_module = Exploding


#: Set in the environment of a `flsuite fit` process that a test interrupts (kill, Ctrl-C): seconds each of its client
#: fits waits first (`PacedFedAvg`).
PACE = "FLSUITE_TEST_CLIENT_PACE_S"


class Paced(ClientModule):
    """A client that waits `PACE` seconds at the start of its fit (inside Lightning's `Trainer.fit`) where its process's
    environment says so: the interrupted run is slow enough to be interrupted in the middle whatever the machine's
    speed; the runs of the test's own process are not."""

    def begin(self) -> None:
        import os
        import time

        time.sleep(float(os.environ.get(PACE, "0")))


class PacedFedAvg(FedAvg):
    """FedAvg of `Paced` clients."""

    client_module = Paced


#: A small command-line config (a linear head on two flattened UCI-digit domains), for `flsuite fit` tests.
SMALL_CONFIG: dict[str, Any] = {
    "name": "cli-test",
    "rounds": 3,
    "seed": 5,
    "data": {
        "class_path": "flsuite.data.builtin.UCIDigitsDomains",
        "init_args": {"domains": ["clean", "rotated"], "flatten": True},
    },
    "model": {"class_path": "flsuite.models.heads.Linear"},
    "local": {"epochs": 1, "batch_size": 32, "lr": 0.05},
    "progress": False,
    "wandb": {"enabled": False},
}


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """`flsuite <args>` in this process: (exit status, stdout, stderr)."""
    from flsuite.cli import main

    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def killed_and_resumed(tmp_path: Path, crash_round: int, **kwargs: Any):
    """Run `head_federation(**kwargs)` once through, and once killed when round `crash_round` starts and then resumed;
    assert the checkpoint held the round before and the resumed `metrics.jsonl` equals the uninterrupted one.
    Returns both final checkpoints (uninterrupted, resumed) for state comparisons."""
    import pytest

    from flsuite.federation.checkpoint import load_checkpoint
    from tests.federation.test_run import CrashAtRound

    head_federation(tmp_path / "full", **kwargs).fit()
    with pytest.raises(KeyboardInterrupt):
        head_federation(tmp_path / "killed", executor=CrashAtRound(crash_round), **kwargs).fit()
    assert load_checkpoint(tmp_path / "killed").round == crash_round - 1
    head_federation(None, **kwargs).fit(resume=tmp_path / "killed")
    assert (tmp_path / "killed" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()
    return load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "killed")


def initial_weights(fed: Federation, data=None):
    """W₀ of the default protocol: the model built from the derived "model_init" stream, as `Rounds` starts a phase."""
    import torch

    from flsuite.federation.weights import clone_weights
    from flsuite.seeding import derive_seed

    data = data if data is not None else fed.build_data()[0]
    torch.manual_seed(derive_seed(fed.seeds.train, purpose="model_init"))
    return clone_weights(fed.model.build(data.input_shape, data.num_classes).state_dict())


def load_experiment(name: str):
    """experiments/<name>.py as a module (the experiment scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_local_ray() -> None:
    """`ray.init` of the tests' local Ray (2 CPUs), its workers able to import the test modules (test-only methods);
    tests/conftest.py `local_ray` starts it once per test process."""
    import os

    import pytest
    import ray

    root = str(Path(__file__).resolve().parents[1])
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


class InProcessPool:
    """`flsuite.pool.WarmPool`'s interface with its runs in this process, one at a time: `run_fit_here`, the pool's own
    task (the run's environment, argv and log as in a warm worker). For tests of experiments/study.py's decisions
    (which runs run, are reused or moved aside; folders; tables), whose behaviour needs no process: the pool's
    processes are tested in tests/test_pool.py."""

    def __init__(self) -> None:
        import threading

        from flsuite.pool import run_fit_here

        self.task, self.runs = run_fit_here, 0
        self._lock = threading.Lock()  # the study's threads take turns: a run owns the process's environment

    def run(self, *args: Any) -> int:
        with self._lock:
            self.runs += 1
            return int(self.task(*args))

    def close(self) -> None:
        pass


def study_in_this_process(study, monkeypatch) -> InProcessPool:
    """experiments/study.py (loaded as `study`) with every `flsuite` command it runs run in this process: its feature
    step (`flsuite features`, else a process of its own) and its runs (`flsuite fit`, else warm worker processes,
    here an `InProcessPool`). Returns the pool (its `runs` counts the runs that ran)."""
    import contextlib

    import pytest

    in_process = InProcessPool()
    real_run = study.run

    def run(cmd: list[str], log: Path, parallel: int = 1, pool: Any = None) -> int:
        if cmd[1:4] != ["-m", "flsuite.cli", "features"]:
            return real_run(cmd, log, parallel, pool)
        from flsuite.cli import main

        log.parent.mkdir(parents=True, exist_ok=True)
        with (
            pytest.MonkeyPatch.context() as env,
            open(log, "w") as out,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(out),
        ):
            for key, value in study.run_env(parallel).items():
                env.setenv(key, value)
            return main(cmd[3:])

    monkeypatch.setattr(study, "run", run)
    monkeypatch.setattr(study, "WarmPool", lambda workers, runs_per_worker=50: in_process)
    return in_process
