"""RayExecutor: same metrics as the serial executor, retries, dropped clients, dead workers, non-finite updates.

All on the test process's local Ray (2 CPUs, tests/conftest.py), its workers handed from run to run (`keep_workers`),
but for two tests that read `own_ray_process`, a process that starts Ray its own way.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from flsuite.federation import ray_workers
from flsuite.federation.method import ClientModule
from flsuite.federation.phases import ClientFailedError
from flsuite.federation.ray_executor import RayExecutor
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.scaffold import Scaffold
from tests.helpers import ExplodingFedAvg, head_federation

ray = pytest.importorskip("ray")


@pytest.fixture(autouse=True)
def ray_running(local_ray):
    """Every test here runs on the process's local Ray (tests/conftest.py `local_ray`)."""


@pytest.fixture(scope="module")
def serial_fedavg(tmp_path_factory) -> str:
    run_dir = tmp_path_factory.mktemp("serial_fedavg")
    head_federation(run_dir).fit()
    return (run_dir / "metrics.jsonl").read_text()


@pytest.fixture(scope="module")
def serial_scaffold(tmp_path_factory) -> str:
    """The serial run of SCAFFOLD (client state), for the tests that run it on Ray."""
    run_dir = tmp_path_factory.mktemp("serial_scaffold")
    head_federation(run_dir, method=Scaffold()).fit()
    return (run_dir / "metrics.jsonl").read_text()


def ray_executor(**kwargs) -> RayExecutor:
    """Two workers, handed from run to run (`keep_workers`): each test compares with the serial run anyway."""
    return RayExecutor(**{"num_workers": 2, "keep_workers": True, **kwargs})


def idle_pids() -> list[int]:
    """The process ids of this process's idle workers (kept by runs with `keep_workers`)."""
    return sorted(ray.get([w.ready.remote() for pool in ray_workers._IDLE.values() for w in pool]))


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---- test-only methods (module level, so Ray workers can import them) ------------------------------------------
@dataclass(frozen=True)
class FaultSettings:
    mode: str
    marker: str
    client: int
    round: int


class Faulty(ClientModule[FaultSettings]):
    """Client `method.client` in round `method.round`: "once" raises on its first attempt, "exit" kills its worker
    process on its first attempt, "always" raises every time. "First" is marked by a file, seen by every worker."""

    def begin(self) -> None:
        m = self.method
        if self.task.client_id != m.client or self.task.round != m.round:
            return
        if m.mode == "always":
            raise RuntimeError("simulated client crash (always)")
        marker = Path(m.marker)
        if not marker.exists():
            marker.touch()
            if m.mode == "exit":
                os._exit(1)
            raise RuntimeError("simulated client crash")


class FaultyFedAvg(FedAvg):
    client_module = Faulty

    def __init__(self, mode: str, marker: str = "", client: int = 1, round: int = 2) -> None:
        super().__init__()
        self.mode, self.marker, self.client, self.round = mode, marker, client, round

    def client_settings(self) -> FaultSettings:
        return FaultSettings(self.mode, self.marker, self.client, self.round)


# ---- tests ------------------------------------------------------------------------------------------------------
def test_ray_equals_serial_for_fedavg(tmp_path, serial_fedavg):
    head_federation(tmp_path, executor=ray_executor()).fit()
    assert (tmp_path / "metrics.jsonl").read_text() == serial_fedavg


def test_kept_workers_serve_the_next_run_with_the_same_metrics_and_are_released(
    tmp_path, serial_fedavg, serial_scaffold, caplog
):
    """`keep_workers`: the second run (another method) takes the first run's two worker processes (it starts none),
    gives them its own environment and computes its serial run's metrics; `release_idle_workers` stops them. The first
    run takes whatever workers earlier tests left idle (or starts its own): the second one must take the first's."""
    head_federation(tmp_path / "first", executor=ray_executor()).fit()
    kept = idle_pids()
    with caplog.at_level("INFO", logger="flsuite.federation.ray_executor"):
        head_federation(tmp_path / "second", method=Scaffold(), executor=ray_executor()).fit()
    assert "RayExecutor: 2 workers (2 reused)" in caplog.text
    assert len(kept) == 2 and idle_pids() == kept
    assert (tmp_path / "first" / "metrics.jsonl").read_text() == serial_fedavg
    assert (tmp_path / "second" / "metrics.jsonl").read_text() == serial_scaffold
    workers = [w for pool in ray_workers._IDLE.values() for w in pool]
    assert ray_workers.release_idle_workers() == 2 and idle_pids() == []
    assert all(stopped(worker) for worker in workers)


def stopped(worker, deadline_s: float = 60.0) -> bool:
    """Whether Ray reports the worker dead within `deadline_s`: `ray.kill` is asynchronous, so a call right after it
    can still be answered (seen once in a stranger's clone); poll until a call fails with RayActorError."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            ray.get(worker.ready.remote(), timeout=deadline_s)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.2)
    return False


def test_idle_workers_of_a_ray_shut_down_since_are_not_taken(own_ray_process, serial_fedavg):
    """A new local Ray numbers its jobs from 1 again: workers kept on the Ray before are not handed on (a CI run in a
    random order once took them and failed with "Can't find actor"), not even offered: the new Ray's run starts its
    own worker without trying one of the old Ray's (which `start` would skip, as gone). Shown in `own_ray_process`
    (its first Ray keeps a worker idle and is shut down, its next run starts a Ray of its own), not on this process's
    Ray, whose workers the other tests here share."""
    out, run = own_ray_process
    assert "RayExecutor: 1 workers" in out["kept"] and "IDLE 1\n" in out["kept"], out["kept"]  # the old Ray kept one
    assert "RayExecutor: 1 workers\n" in out["ours"] and "reused" not in out["ours"], out["ours"]
    assert "an idle Ray worker was gone" not in out["ours"], out["ours"]
    assert (run / "metrics.jsonl").read_text() == serial_fedavg


def test_without_keep_workers_a_run_stops_its_workers(tmp_path, serial_fedavg, monkeypatch):
    """Without `keep_workers` the run's workers (here one, taken from those earlier tests left idle or started) are
    not left idle at `close`, and Ray reports them dead."""
    used: list = []
    close = RayExecutor.close
    monkeypatch.setattr(RayExecutor, "close", lambda self: used.extend(self._actors) or close(self))
    head_federation(tmp_path, executor=ray_executor(num_workers=1, keep_workers=False)).fit()
    assert (tmp_path / "metrics.jsonl").read_text() == serial_fedavg
    assert len(used) == 1
    idle = [w for pool in ray_workers._IDLE.values() for w in pool]
    assert not [w for w in used if w in idle]  # actor handles compare by actor id
    assert all(stopped(worker) for worker in used)


def test_ray_equals_serial_for_a_method_with_client_state(tmp_path, serial_scaffold):
    head_federation(tmp_path, method=Scaffold(), executor=ray_executor()).fit()
    assert (tmp_path / "metrics.jsonl").read_text() == serial_scaffold


@pytest.mark.slow
def test_a_client_failing_once_is_retried(tmp_path, serial_fedavg):
    marker = tmp_path / "failed_once"
    head_federation(tmp_path / "run", method=FaultyFedAvg("once", str(marker)), executor=ray_executor()).fit()
    assert marker.exists()
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == serial_fedavg


@pytest.mark.slow
def test_a_client_that_always_fails_is_dropped_and_recorded(tmp_path):
    executor = ray_executor(max_retries=1)
    with pytest.raises(ClientFailedError, match=r"client\(s\) \[1\] failed after 2 attempt"):
        head_federation(tmp_path / "fail", method=FaultyFedAvg("always"), executor=executor).fit()
    head_federation(
        tmp_path / "drop", method=FaultyFedAvg("always"), executor=ray_executor(), on_client_failure="drop"
    ).fit()
    assert [r["clients_failed"] for r in records(tmp_path / "drop")] == [[], [1], []]


@pytest.mark.slow
def test_a_worker_dying_mid_round_is_replaced(tmp_path, serial_fedavg):
    marker = tmp_path / "died_once"
    head_federation(tmp_path / "run", method=FaultyFedAvg("exit", str(marker)), executor=ray_executor()).fit()
    assert marker.exists()
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == serial_fedavg


@pytest.mark.slow
def test_non_finite_updates_from_ray_workers_are_rejected(tmp_path):
    head_federation(tmp_path, method=ExplodingFedAvg(), executor=ray_executor()).fit()
    assert [r["clients_rejected"] for r in records(tmp_path)] == [[], [0], []]


def test_executor_leaves_an_outside_ray_running_and_needs_start():
    executor = ray_executor()
    with pytest.raises(RuntimeError, match="before start"):
        executor.run([])
    executor.close()
    assert ray.is_initialized()


@pytest.mark.slow
def test_ray_equals_serial_with_a_server_fit_and_setup_queries(tmp_path):
    """A server-side Lightning fit (seeded from the server stream) and GGEUR's statistics query on Ray workers give
    the serial executor's numbers and weights."""
    from flsuite.federation.checkpoint import load_checkpoint
    from flsuite.federation.server import ServerFinetune
    from flsuite.methods.ggeur import GGEUR
    from tests.federation.test_phases import public_data

    def run(path, executor):
        step = ServerFinetune(public_data(), epochs=1, lr=0.1)
        setup = [GGEUR(target_per_class=30, samples_per_prototype=10)]
        kwargs = {"executor": executor} if executor else {}
        head_federation(path, server_steps=[step], setup=setup, **kwargs).fit()

    run(tmp_path / "serial", None)
    run(tmp_path / "ray", ray_executor())
    assert (tmp_path / "ray" / "metrics.jsonl").read_text() == (tmp_path / "serial" / "metrics.jsonl").read_text()
    setup = [
        {k: v for k, v in json.loads((tmp_path / d / "setup.json").read_text()).items() if not k.endswith("seconds")}
        for d in ("serial", "ray")
    ]
    assert setup[0] == setup[1] and setup[0]["setup/ggeur/bytes_up"] > 0
    a, b = load_checkpoint(tmp_path / "serial").global_weights, load_checkpoint(tmp_path / "ray").global_weights
    assert all(torch.equal(a[k], b[k]) for k in a)


#: A process of its own Ray: first a user's Ray (1 CPU), on which a run keeps its worker idle (the count
#: of idle workers printed) before that Ray is shut down; then a run that starts a local Ray of its own (and keeps its
#: workers: they must not be those of the Ray before); then Ray's token-authentication warnings outside flsuite's
#: `ray.init`. Each part's stderr follows its "--- part ---" line. Ray warns at the first local start of a process
#: whose RAY_AUTH_MODE is unset and sets it to "token" for the process (a later start does not warn): the script
#: unsets it again after the user's Ray, as in a new process, and prints it after flsuite's start ("token": that start
#: took the path that warns).
OWN_RAY = """
import logging, os, sys
from pathlib import Path
import ray
from ray._private.authentication import authentication_token_setup as auth
from flsuite.federation import ray_workers
from flsuite.federation.ray_executor import RayExecutor
from tests.helpers import head_federation
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")  # as the CLI does
def part(name):
    print(f"--- {name} ---", file=sys.stderr, flush=True)
part("kept")
ray.init(num_cpus=1, include_dashboard=False)  # warns (the process's first local start)
head_federation(Path(sys.argv[1]) / "kept", rounds=1, executor=RayExecutor(num_workers=1, keep_workers=True)).fit()
print("IDLE", sum(len(pool) for pool in ray_workers._IDLE.values()), file=sys.stderr, flush=True)
ray.shutdown()
os.environ.pop("RAY_AUTH_MODE", None)
part("ours")
head_federation(Path(sys.argv[1]) / "run", executor=RayExecutor(num_cpus=1, num_workers=1, keep_workers=True)).fit()
print("RAY_AUTH_MODE", os.environ.get("RAY_AUTH_MODE"), file=sys.stderr, flush=True)
part("after")
auth._warn_token_auth_enabled()  # the same warning outside flsuite's ray.init
auth._warn_token_auth_disabled()  # and a genuine one from the same logger
"""


@pytest.fixture(scope="module")
def own_ray_process(tmp_path_factory) -> tuple[dict[str, str], Path]:
    """`OWN_RAY` run once for the module (it needs a process without this one's Ray): its stderr by part, and the run
    directory of its run on its own Ray (the default federation: compared with `serial_fedavg`)."""
    import subprocess
    import sys

    tmp_path = tmp_path_factory.mktemp("own_ray")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    proc = subprocess.run(
        [sys.executable, "-c", OWN_RAY, str(tmp_path)], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, *pieces = re.split(r"^--- (\w+) ---\n", proc.stderr, flags=re.M)  # [before, name, its text, name, ...]
    parts = dict(zip(pieces[::2], pieces[1::2]))
    assert list(parts) == ["kept", "ours", "after"], proc.stderr[-3000:]
    return parts, tmp_path / "run"


@pytest.mark.slow
def test_a_local_run_drops_rays_token_auth_opt_out_warning_for_its_own_start_only(own_ray_process):
    """A local RayExecutor does not print Ray's "Token authentication is enabled ... Set RAY_AUTH_MODE=disabled to
    opt out" (a cluster only this process uses); Ray's other output, and that logger's warnings outside flsuite's
    `ray.init` (a user's own, and later calls), still show."""
    out, run = own_ray_process
    ours, after = out["ours"], out["after"]
    assert "Started a local Ray instance" in ours and "RayExecutor: 1 workers" in ours  # Ray and flsuite still speak
    assert "RAY_AUTH_MODE token\n" in ours and "Token authentication is enabled" not in ours, ours
    for outside in (out["kept"], after):
        assert "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out" in outside
    assert "Token authentication is disabled for this Ray cluster" in after
    assert (run / "summary.json").is_file()
