"""Test-wide settings: no network, no W&B server, no Ray telemetry; libraries' global state left as each test found it."""

import os
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def changed_keys(before: dict, after: dict) -> list[str]:
    """Keys added, removed or changed between two copies of a config mapping."""
    return sorted(set(before) ^ set(after) | {k for k in set(before) & set(after) if before[k] != after[k]})


@pytest.fixture(autouse=True)
def global_library_state_is_scoped():
    """Every test runs inside `torch.random.fork_rng` (torch's scoped API for its global generator), so a test's
    `torch.manual_seed` does not leak into the next; and a test that leaves `torch._dynamo.config` changed fails here,
    naming the keys. Set dynamo's options with `torch._dynamo.config.patch(...)`: pytest 9's `monkeypatch.setattr` on
    that module records a value served by its `__getattr__` as absent and deletes the key on undo, which broke every
    later compilation in the process."""
    dynamo = sys.modules.get("torch._dynamo")
    before = dynamo.config.get_config_copy() if dynamo is not None else None
    with torch.random.fork_rng(devices=[]):
        yield
    if before is not None:
        leaked = changed_keys(before, dynamo.config.get_config_copy())
        if leaked:
            pytest.fail(f"the test left torch._dynamo.config changed ({', '.join(leaked)}): use torch._dynamo.config.patch")
