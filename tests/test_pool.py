"""flsuite.pool.WarmPool (issue 35, item 2): runs in a warm worker are the runs of a fresh process, byte for byte, after
another run in the same worker; a run that raises or a worker that dies fails that run alone, and the pool replaces
the worker."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flsuite.pool import KILLED, WarmPool, run_fit_here

ROOT = Path(__file__).resolve().parents[1]
#: The quickstart, smaller: 2 rounds of 1 epoch on its 4 domains, one client each (its CNN and pinned thread count).
QUICK = [
    "--config",
    str(ROOT / "configs" / "quickstart.yaml"),
    "--rounds",
    "2",
    "--local.epochs",
    "1",
    "--data.init_args.clients_per_domain",
    "1",
]
QUICK += ["--progress", "false", "--wandb.enabled", "false"]


def fit_noting_pid(argv: list[str], log_file: str, env: dict[str, str], pid_file: str) -> int:
    """`run_fit_here`, and the worker's pid written to `pid_file` (which worker ran it)."""
    Path(pid_file).write_text(str(os.getpid()))
    return run_fit_here(argv, log_file, env)


def pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def raises() -> int:
    raise RuntimeError("a task that raises")


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", **extra}


@pytest.mark.slow
def test_a_run_in_a_warm_worker_after_another_run_is_the_fresh_process_run_byte_for_byte(tmp_path: Path) -> None:
    """The quickstart (2 rounds, smaller) in a fresh `flsuite fit` process, and twice in one warm worker after a
    SCAFFOLD run of another seed with other thread and environment settings, a run that raises (status 1, its traceback
    in its log) and one with a config error (status 2): the same metrics.jsonl, byte for byte, and the same thread
    decision; the worker outlives the failed runs. The fresh process runs beside the worker (nothing is compared before
    both are done)."""
    fresh = tmp_path / "fresh"
    cmd = [sys.executable, "-m", "flsuite.cli", "fit", *QUICK, "--run_dir", str(fresh)]
    with open(tmp_path / "fresh.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            pids = warm_runs(tmp_path)
            proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, (tmp_path / "fresh.log").read_text()
    # the thread decision the fresh process logged (1 intra-op thread, the quickstart's; FLSUITE_THREADS overrides it)
    (decided,) = [
        line
        for line in (tmp_path / "fresh.log").read_text().splitlines()
        if line.startswith("INFO flsuite.runtime: torch threads:")
    ]
    assert "torch threads: 1 intra-op" in decided or "(FLSUITE_THREADS)" in decided, decided
    for i in (1, 2):
        run_dir = tmp_path / f"warm{i}"
        assert decided in (tmp_path / f"warm{i}.log").read_text().splitlines()
        assert (run_dir / "metrics.jsonl").read_bytes() == (fresh / "metrics.jsonl").read_bytes()
        assert (run_dir / "config.yaml").read_bytes() == (fresh / "config.yaml").read_bytes().replace(
            str(fresh).encode(), str(run_dir).encode()
        )
    assert len(set(pids)) == 1  # one warm worker ran all five
    import json

    recorded = [json.loads((d / "environment.json").read_text()) for d in (fresh, tmp_path / "warm1")]
    assert recorded[0]["threads"] == recorded[1]["threads"]
    assert recorded[1]["argv"][1:] == [
        "fit",
        *QUICK,
        "--run_dir",
        str(tmp_path / "warm1"),
    ]  # as `python -m flsuite.cli fit`


def warm_runs(tmp_path: Path) -> list[str]:
    """In one warm worker: the other run, the failing ones, then the quickstart twice (into warm1, warm2); the pids of
    the worker that ran each."""
    pids = []
    with WarmPool(workers=1, task=fit_noting_pid) as pool:
        other = [
            *QUICK,
            "--config",
            str(ROOT / "configs" / "baselines" / "scaffold.yaml"),
            "--seed",
            "3",
            "--threads.intra_op",
            "2",
            "--run_dir",
            str(tmp_path / "other"),
        ]
        assert (
            pool.run(other, str(tmp_path / "other.log"), env(FLSUITE_PARALLEL="2", LEAKED="1"), str(tmp_path / "pid0"))
            == 0
        )
        pids.append((tmp_path / "pid0").read_text())
        failing = [
            *QUICK,
            "--run_dir",
            str(tmp_path / "failing"),
            "--checkpoint_every",
            "0",
        ]  # raises (FLSUITE_DEBUG: unreported)
        assert pool.run(failing, str(tmp_path / "failing.log"), env(FLSUITE_DEBUG="1"), str(tmp_path / "pidf")) == 1
        assert (
            "Traceback" in (tmp_path / "failing.log").read_text()
            and "checkpoint_every" in (tmp_path / "failing.log").read_text()
        )
        missing = ["--config", str(tmp_path / "missing.yaml")]  # a user error: the status `flsuite fit` exits with
        assert pool.run(missing, str(tmp_path / "missing.log"), env(), str(tmp_path / "pidm")) == 2
        assert "missing.yaml" in (tmp_path / "missing.log").read_text()
        pids += [(tmp_path / "pidf").read_text(), (tmp_path / "pidm").read_text()]
        for i in (1, 2):
            run_dir = tmp_path / f"warm{i}"
            assert (
                pool.run(
                    [*QUICK, "--run_dir", str(run_dir)],
                    str(tmp_path / f"warm{i}.log"),
                    env(),
                    str(tmp_path / f"pid{i}"),
                )
                == 0
            )
            pids.append((tmp_path / f"pid{i}").read_text())
    return pids


def test_a_killed_worker_fails_its_run_alone_and_is_replaced(tmp_path: Path) -> None:
    """Two slots: one worker dies (os._exit) while the other runs a task; that task finishes, the dead worker's run
    reports KILLED, the next run on that slot gets a new worker, and a task that raises raises in the caller alone."""
    with WarmPool(workers=2, task=pid_after, warm=False) as pool:
        results: dict[str, int] = {}
        slow = threading.Thread(target=lambda: results.__setitem__("slow", pool.run(3.0)))
        slow.start()
        time.sleep(0.5)
        pool.task = os._exit  # the other slot's worker: killed during its run
        assert pool.run(9) == KILLED
        pool.task = pid_after
        slow.join()
        assert results["slow"] > 0 and pool.replaced == 1
        assert pool.run(0.0) > 0 and pool.run(0.0) > 0  # both slots run again
        pool.task = raises
        with pytest.raises(RuntimeError, match="a task that raises"):
            pool.run()
        pool.task = pid_after
        assert pool.run(0.0) > 0 and pool.replaced == 1  # a raise is not a dead worker
