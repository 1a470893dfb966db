"""The install's promises: the lock file agrees with pyproject.toml and is made by the documented command, and
dependencies that are known to break us carry their upper bound."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
#: The command that writes the lock (README "Set up and run"); uv writes it into the lock's header.
LOCK_COMMAND = (
    "uv pip compile pyproject.toml --extra dev --universal --python-version 3.11 --constraint "
    "requirements/lock-constraints.txt -o requirements/lock.txt"
)


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements() -> list[Requirement]:
    """Every requirement the dev install resolves, the lock's scope: the package's, the dev extra's and those of the
    extras dev names (`flsuite[...]`, the self-references left out). An extra installed apart is not locked (`bench`:
    Flower pins its own Ray, so it gets a venv of its own)."""
    p = project()
    extras = p["optional-dependencies"]
    dev = [Requirement(r) for r in extras["dev"]]
    names = {"dev"} | {e for r in dev if canonicalize_name(r.name) == "flsuite" for e in r.extras}
    reqs = [Requirement(r) for r in p["dependencies"]] + [
        Requirement(r) for name in sorted(names) for r in extras[name]
    ]
    return [r for r in reqs if canonicalize_name(r.name) != "flsuite"]


def locked(python: str = "3.11") -> dict[str, str]:
    """name -> pinned version of every lock line whose marker holds on Linux x86_64 with `python`."""
    env = default_environment() | {
        "python_version": python,
        "python_full_version": f"{python}.7",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
    }
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(env):
                (spec,) = req.specifier
                pins[canonicalize_name(req.name)] = spec.version
    return pins


def test_the_lock_pins_every_dependency_within_pyproject_ranges():
    pins = locked()
    for req in requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"requirements/lock.txt has no {req.name}: regenerate it ({LOCK_COMMAND})"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"requirements/lock.txt pins {req.name}=={pins[name]}, outside pyproject.toml's {req}: regenerate it"
        )


def test_the_lock_is_written_by_the_documented_command():
    header = LOCK.read_text().splitlines()[:3]
    assert any(line.strip("# ").strip() == LOCK_COMMAND for line in header), header
    assert LOCK_COMMAND in (ROOT / "README.md").read_text()


def test_known_breaking_releases_are_excluded():
    """sweeps 0.3 requires numpy<2 while the rest of the tree resolves to numpy 2: pip then backtracked for over 20
    minutes through torch, torchvision and optuna instead of failing (issue 21)."""
    by_name = {canonicalize_name(r.name): r for r in requirements()}
    assert not by_name["sweeps"].specifier.contains("0.3.0") and by_name["sweeps"].specifier.contains("0.2.0")
    for name in ("torch", "lightning", "sweeps", "ruff"):
        assert any(s.operator == "<" for s in by_name[name].specifier), f"{name} has no upper bound"


def test_ci_installs_into_a_fresh_venv_with_a_time_limit():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"python\"? -m venv ", ci) and "timeout" in ci


def test_ci_runs_as_a_stranger_in_a_fresh_clone_with_a_new_home():
    """CI tests the commit as a stranger would meet it (issue 32): a clone in a new temporary folder, a new empty HOME,
    no variable of ours pointing libraries at our caches, only the declared datasets beside the clone."""
    ci = (ROOT / ".ci" / "run").read_text()
    clone, home, tests = ci.index("git clone"), ci.index('export HOME="$work/home"'), ci.index("python -m pytest -q")
    assert 'work="$(mktemp -d' in ci and clone < home < tests and 'cd "$work/flsuite"' in ci
    assert all(
        name in ci.split("unset", 1)[1].split("export HOME", 1)[0]
        for name in ("TORCH_HOME", "HF_HOME", "XDG_CACHE_HOME", "WANDB_API_KEY", "PYTHONPATH")
    )
    assert '"$work/shared/data"' in ci and 'rm -rf "$work"' in ci
    readme = (ROOT / "README.md").read_text()
    test_command = 'python -m pip install -e ".[dev]" && python -m pytest -q -n auto'
    assert test_command in readme and test_command in ci


def test_the_tests_run_in_a_random_order_whose_seed_ci_prints():
    """pytest-randomly (dev extra) shuffles every run of the README's command; CI chooses the seed and prints it, so a
    verdict that depends on the order shows up and can be replayed (issue 33)."""
    assert "pytest-randomly" in [
        canonicalize_name(Requirement(r).name) for r in project()["optional-dependencies"]["dev"]
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "--randomly-seed=$order_seed" in ci and 'echo "ci: tests in random order, seed $order_seed' in ci


def test_ci_runs_the_configured_lint_format_and_type_checks_before_the_tests():
    """The habits live in the repository: ruff and mypy are configured in pyproject.toml, pinned in the dev extra (a
    ruff minor release changes its rules and formatting) and run by .ci/run, before the README's test command."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["ruff"]["lint"]["select"] and pyproject["tool"]["mypy"]["files"] == ["flsuite"]
    ci = (ROOT / ".ci" / "run").read_text()
    checks = [
        ci.index(c)
        for c in (
            "python -m ruff check .",
            "python -m ruff format --check .",
            "python -m mypy\n",
            "python -m pytest -q",
        )
    ]
    assert checks == sorted(checks)
