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
        data=GaussianFeatures(dim=8, num_classes=3, num_domains=2, clients_per_domain=2, samples_per_client=60, test_per_domain=60),
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


#: A small command-line config (a linear head on two flattened UCI-digit domains), for `flsuite fit` tests.
SMALL_CONFIG: dict[str, Any] = {
    "name": "cli-test",
    "rounds": 3,
    "seed": 5,
    "data": {"class_path": "flsuite.data.builtin.UCIDigitsDomains", "init_args": {"domains": ["clean", "rotated"], "flatten": True}},
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
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py")
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
