"""Test-wide settings: no network, no W&B server, no Ray telemetry; libraries' global state left as each test found it."""

import os
import warnings

# Under pytest-xdist (the README's `-n auto`) each worker gets its share of the cores, set before torch is imported:
# threads spinning on shared cores were measured 30-55x slower. FLSUITE_PARALLEL gives flsuite's own thread policy
# the same share for image models (feature heads take 1 thread anyway).
if (_workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT")) is not None:
    _share = str(max(1, (os.cpu_count() or 1) // max(1, int(_workers))))
    os.environ.setdefault("OMP_NUM_THREADS", _share)
    os.environ.setdefault("FLSUITE_PARALLEL", _workers)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402  (imported up front, so the guard below sees a test's first use of dynamo too)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def readable(config) -> dict:
    """Every option of a torch config module as it reads now; one deleted (hidden, as pytest 9's undo leaves it) reads
    as missing, which its `get_config_copy()` alone does not show."""
    with warnings.catch_warnings():  # reading a deprecated option warns; that is not the test's doing
        warnings.simplefilter("ignore", FutureWarning)
        return {k: getattr(config, k, "<missing>") for k in config.get_config_copy()}


def changed_keys(before: dict, after: dict) -> list[str]:
    """Keys added, removed or changed between two readings of a config module."""
    return sorted(set(before) ^ set(after) | {k for k in set(before) & set(after) if before[k] != after[k]})


@pytest.fixture(autouse=True)
def global_library_state_is_scoped():
    """Every test runs inside `torch.random.fork_rng` (torch's scoped API for its global generator), so a test's
    `torch.manual_seed` does not leak into the next; and a test that leaves `torch._dynamo.config` changed fails here,
    naming the keys. Set dynamo's options with `torch._dynamo.config.patch(...)`: pytest 9's `monkeypatch.setattr` on
    that module records a value served by its `__getattr__` as absent and deletes the key on undo, which broke every
    later compilation in the process."""
    before = readable(torch._dynamo.config)
    with torch.random.fork_rng(devices=[]):
        yield
    leaked = changed_keys(before, readable(torch._dynamo.config))
    if leaked:
        pytest.fail(f"the test left torch._dynamo.config changed ({', '.join(leaked)}): use torch._dynamo.config.patch")


def pytest_collection_modifyitems(config, items):
    """Test ids must not depend on the process (e.g. `ids=repr` names objects by memory address): pytest-xdist's
    workers each collect the suite and stop the run when their names differ."""
    unstable = [item.nodeid for item in items if " at 0x" in item.nodeid]
    if unstable:
        raise pytest.UsageError(f"test ids that name memory addresses (give the parametrisation explicit ids): {unstable[:3]}")
