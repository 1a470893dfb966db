"""Test-wide settings: no network, no W&B server, no Ray telemetry; libraries' global state left as each test found
it."""

import os
import sys
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


@pytest.fixture(scope="session", autouse=True)
def caches_of_the_tests(tmp_path_factory):
    """flsuite's per-user cache (the cached `fit --help` text) and the feature cache of relative `cache_dir`s
    (`$FLSUITE_CACHE`, else the working directory: the user's checkout for the tests run from it) in folders of the
    session, not the user's ~/.cache or checkout; subprocesses inherit them."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FLSUITE_USER_CACHE", str(tmp_path_factory.mktemp("user_cache")))
        env.setenv("FLSUITE_CACHE", str(tmp_path_factory.mktemp("feature_cache")))
        yield


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


#: What a test marked `slow` (10-110 s on 2 cores) weighs against an unmarked one (mostly under 2 s) when the work
#: units are ordered by cost.
SLOW_WEIGHT = 20

#: The modules that start the process's local Ray (`local_ray`) or compile (the compiled loop): under `-n auto` they
#: go to one worker, one unit, so the suite starts one local Ray and its two kept workers instead of one per worker,
#: and pays a process's first compilation once. A module that starts the local Ray or compiles belongs here.
SHARED_PROCESS = frozenset(
    {
        "tests/federation/test_ray_executor.py",
        "tests/federation/local/test_compiled.py",
        "tests/federation/local/test_choice.py",
        "tests/methods/test_fedcir.py",
        "tests/methods/test_fedcir_terms.py",
        "tests/methods/test_fedegg.py",
        "tests/methods/test_fedfa.py",
        "tests/methods/test_fedmix.py",
        "tests/test_runtime.py",
    }
)


def work_unit(nodeid: str) -> str:
    """What `-n auto` hands to a worker whole: a test's module, or the modules of `SHARED_PROCESS` together."""
    module = nodeid.split("::")[0]
    return "local Ray and compiler" if module in SHARED_PROCESS else module


def unit_cost(items: list[pytest.Item]) -> int:
    return sum(SLOW_WEIGHT if item.get_closest_marker("slow") else 1 for item in items)


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` (pyproject.toml) with `work_unit` as the scope instead of the module."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnits(config, log)


def pytest_collection_modifyitems(config, items):
    """Test ids must not depend on the process (e.g. `ids=repr` names objects by memory address): pytest-xdist's
    workers each collect the suite and stop the run when their names differ.

    Then the costliest work units first: the README's `-n auto` hands whole units (`work_unit`: a module, or the
    modules that share a local Ray and the compiler) to workers (`--dist loadscope`, so a unit's fixtures, such as a
    Ray cluster, start once) in this order, so the long ones start first and the workers finish together. Stable:
    tests keep pytest-randomly's order within a module, and units of equal cost its order. A unit's modules run in
    the order of their paths, which measured faster for the shared unit than pytest-randomly's orders
    (docs/install.md)."""
    unstable = [item.nodeid for item in items if " at 0x" in item.nodeid]
    if unstable:
        raise pytest.UsageError(
            f"test ids that name memory addresses (give the parametrisation explicit ids): {unstable[:3]}"
        )
    units: dict[str, dict[str, list[pytest.Item]]] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        units.setdefault(work_unit(item.nodeid), {}).setdefault(module, []).append(item)
    ordered = [[item for module in sorted(unit) for item in unit[module]] for unit in units.values()]
    items[:] = [item for unit in sorted(ordered, key=unit_cost, reverse=True) for item in unit]


@pytest.fixture
def local_ray():
    """One local Ray (2 CPUs) per test process, started by the first test that asks and kept for the next (a
    `ray.init` costs seconds); shut down at the end of the session or by a test that needs Ray started its own way
    (`no_local_ray`). Workers import test modules by name (test-only methods), so the checkout is on their path."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        from tests.helpers import start_local_ray

        start_local_ray()
    return ray


@pytest.fixture
def no_local_ray():
    """No Ray running in this process (the shared `local_ray` shut down), for a test that starts Ray its own way."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The random order's seed at the end of every run, `-q` too (pytest-randomly prints it in the header, which `-q`
    hides): a verdict that changes with the order can then be replayed. Nothing without the plugin (-p no:randomly)."""
    if config.pluginmanager.has_plugin("randomly") and isinstance(seed := config.getoption("randomly_seed", None), int):
        terminalreporter.write_line(f"random test order: replay it with --randomly-seed={seed}")


def pytest_sessionfinish(session, exitstatus):
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()
