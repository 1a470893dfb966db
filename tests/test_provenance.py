"""flsuite.provenance: the code version a run records (in and outside a git checkout) and the one rule that decides
whether an existing run folder is the experiment a study driver asks for."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from flsuite import provenance
from flsuite.provenance import code_label, code_mix, git_state, move_aside, same_experiment

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {
    "seed": 0,
    "rounds": 3,
    "run_dir": "runs/a",
    "name": "x",
    "wandb": {"enabled": False},
    "local": {"lr": 0.1},
    "last_k": 5,
}
CLEAN = {"version": "0.1.0", "commit": "a" * 40, "dirty": False, "uncommitted": None}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def committed_repo(tmp_path: Path) -> tuple[Path, str]:
    """A git repository holding one committed file, a.py, and its HEAD commit."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "a.py")
    git(repo, "commit", "-q", "-m", "one")
    return repo, git(repo, "rev-parse", "HEAD").strip()


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and this checkout's .git"
)
def test_the_checkout_records_its_head_commit():
    commit, _ = git_state(ROOT)
    assert commit == git(ROOT, "rev-parse", "HEAD").strip()
    version = provenance.code_version()
    assert (
        version["version"]
        and version["dirty"] in (True, False)
        and (version["uncommitted"] is not None) == version["dirty"]
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_uncommitted_changes_are_fingerprinted_by_content(tmp_path: Path):
    repo, head = committed_repo(tmp_path)
    assert git_state(repo) == (head, None)  # clean
    (repo / "a.py").write_text("x = 2\n")
    first = git_state(repo)
    assert first[0] == head and first[1] is not None
    (repo / "a.py").write_text("x = 3\n")
    assert git_state(repo)[1] != first[1]  # other changes: another fingerprint
    (repo / "a.py").write_text("x = 2\n")
    assert git_state(repo) == first  # the same changes again: the same fingerprint
    (repo / "new.py").write_text("y = 1\n")  # an untracked file is a change too
    assert git_state(repo)[1] not in (None, first[1])
    (repo / "new.py").unlink()
    (repo / ".gitignore").write_text("runs/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-am", "two")
    (repo / "runs").mkdir()
    (repo / "runs" / "r.json").write_text("{}")  # ignored files are not
    assert git_state(repo) == (git(repo, "rev-parse", "HEAD").strip(), None)
    (repo / "docs" / "results").mkdir(parents=True)
    (repo / "docs" / "results" / "t.md").write_text("| a study's table |\n")  # docs are not code either
    assert git_state(repo) == (git(repo, "rev-parse", "HEAD").strip(), None)
    (repo / "docsx.py").write_text("z = 1\n")  # a file whose name only starts like docs/ is
    assert git_state(repo)[1] is not None


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_virtual_environment_inside_the_checkout_is_not_code_and_is_not_read(tmp_path: Path, monkeypatch):
    """A venv made inside the checkout and not ignored (any name: a folder holding pyvenv.cfg, at any depth) leaves
    the tree clean and none of its files is read; an untracked file beside it still counts."""
    repo, head = committed_repo(tmp_path)
    for venv in (repo / "env", repo / "tools" / "venv-3.11"):
        (venv / "lib" / "site-packages" / "pkg").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (venv / "lib" / "site-packages" / "pkg" / "big.py").write_text("# installed\n")
    read = Path.read_bytes

    def no_venv_reads(path: Path) -> bytes:
        assert "site-packages" not in str(path) and path.name != "pyvenv.cfg", f"read {path}"
        return read(path)

    monkeypatch.setattr(Path, "read_bytes", no_venv_reads)
    assert git_state(repo) == (head, None)
    (repo / "envy.py").write_text("y = 1\n")  # a file whose name only starts like the venv's folder is code
    assert git_state(repo)[1] is not None


def test_outside_a_git_checkout_the_commit_is_null_and_nothing_fails(tmp_path: Path, monkeypatch):
    """The package copied to a folder that is no checkout (as a wheel installs it) and imported from there."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "flsuite", site / "flsuite", ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        "import json; from flsuite import provenance; print(json.dumps([str(provenance.package_root()), "
        "provenance.code_version()]))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    root, version = json.loads(done.stdout)
    assert Path(root) == site
    assert (
        version["commit"] is None and version["dirty"] is None and version["uncommitted"] is None and version["version"]
    )
    # a folder that looks like a checkout but git fails on, or no git at all: no commit either
    (tmp_path / "fake" / ".git").mkdir(parents=True)
    assert git_state(tmp_path / "fake") == (None, None)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert git_state(ROOT) == (None, None)


def run_folder(path: Path, config: dict, code: dict | None) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "environment.json").write_text(json.dumps({"seed": 0, **({"code": code} if code is not None else {})}))
    return path


def test_same_config_and_code_is_reused_whatever_the_folder_or_logging(tmp_path: Path):
    run = run_folder(tmp_path / "a", CONFIG, CLEAN)
    request = CONFIG | {
        "run_dir": "elsewhere",
        "name": "y",
        "wandb": {"enabled": True, "mode": "offline"},
        "progress": True,
    }
    decision = same_experiment(run, yaml.safe_dump(request), CLEAN)
    assert decision.same and decision.reason == "same config and code (aaaaaaaaaa)"


@pytest.mark.parametrize(
    ("request_change", "reason"),
    [
        ({"local": {"lr": 0.2}}, "its config differs: local.lr: 0.1 -> 0.2"),
        ({"seed": 1}, "its config differs: seed: 0 -> 1"),
        ({"last_k": 10}, "its config differs: last_k: 5 -> 10"),
        ({"target_acc": 50.0}, "its config differs: target_acc: (absent) -> 50.0"),
    ],
)
def test_a_config_that_differs_is_not_reused_and_the_key_is_named(tmp_path: Path, request_change: dict, reason: str):
    run = run_folder(tmp_path / "a", CONFIG, CLEAN)
    decision = same_experiment(run, yaml.safe_dump(CONFIG | request_change), CLEAN)
    assert not decision.same and decision.reason == reason


def test_other_code_is_not_reused_and_both_versions_are_named(tmp_path: Path):
    config = yaml.safe_dump(CONFIG)
    other = CLEAN | {"commit": "b" * 40}
    decision = same_experiment(run_folder(tmp_path / "a", CONFIG, other), config, CLEAN)
    assert not decision.same
    assert decision.reason == "it was made by code bbbbbbbbbb (flsuite 0.1.0), this is aaaaaaaaaa (flsuite 0.1.0)"
    dirty = CLEAN | {"dirty": True, "uncommitted": "0123456789abcdef"}
    assert same_experiment(
        run_folder(tmp_path / "b", CONFIG, dirty), config, dirty
    ).same  # identical uncommitted changes
    decision = same_experiment(
        run_folder(tmp_path / "c", CONFIG, dirty), config, dirty | {"uncommitted": "fedcba9876543210"}
    )
    assert decision.reason == (
        "it was made by code aaaaaaaaaa + uncommitted 01234567 (flsuite 0.1.0), this is aaaaaaaaaa + "
        "uncommitted fedcba98 (flsuite 0.1.0)"
    )
    assert (
        "made by code aaaaaaaaaa + uncommitted" in same_experiment(tmp_path / "b", config, CLEAN).reason
    )  # dirty vs clean
    assert (
        "(flsuite 0.0.9)"
        in same_experiment(run_folder(tmp_path / "d", CONFIG, CLEAN | {"version": "0.0.9"}), config, CLEAN).reason
    )
    for name, code in (
        ("e", None),
        ("f", CLEAN | {"commit": None, "dirty": None}),
    ):  # an old run; a run outside a checkout
        decision = same_experiment(run_folder(tmp_path / name, CONFIG, code), config, CLEAN)
        assert not decision.same and decision.reason.startswith("it recorded no commit")
    decision = same_experiment(tmp_path / "d", config, CLEAN | {"commit": None})  # this code is not a checkout
    assert decision.reason.endswith("this code is not a git checkout (no commit to compare)")


def test_config_and_code_reasons_are_given_together_and_a_folder_without_config_is_not_reused(tmp_path: Path):
    run = run_folder(tmp_path / "a", CONFIG, CLEAN | {"commit": "b" * 40})
    reason = same_experiment(run, yaml.safe_dump(CONFIG | {"rounds": 4}), CLEAN).reason
    assert reason.startswith("its config differs: rounds: 3 -> 4; it was made by code bbbbbbbbbb")
    (run / "config.yaml").unlink()
    assert same_experiment(run, yaml.safe_dump(CONFIG), CLEAN).reason.startswith("it has no config.yaml;")


def test_move_aside_keeps_the_old_run_in_a_hidden_folder(tmp_path: Path):
    for _ in range(2):  # twice in the same second: two folders
        run = run_folder(tmp_path / "study" / "fedavg" / "seed0", CONFIG, CLEAN)
        moved = move_aside(run)
        assert not run.exists() and (moved / "config.yaml").is_file()
        assert moved.parent == tmp_path / "study" / "fedavg" / ".replaced" and moved.name.startswith("seed0-")
    assert len(list((tmp_path / "study" / "fedavg" / ".replaced").iterdir())) == 2


def test_code_labels_and_the_mixed_code_warning():
    assert code_label(CLEAN) == "aaaaaaaaaa" and code_label(None) == "no commit recorded"
    assert code_label(CLEAN | {"dirty": True, "uncommitted": "0123456789abcdef"}) == "aaaaaaaaaa + uncommitted 01234567"
    assert code_mix([CLEAN, CLEAN]) == "" and code_mix([None, None]) == "" and code_mix([]) == ""
    assert code_mix([CLEAN, None, CLEAN]) == (
        "Warning: these runs come from 2 code versions: aaaaaaaaaa (2 runs), no commit recorded (1 run); a "
        "table should hold runs of one."
    )


def test_a_resume_keeps_the_starting_code_and_appends_its_own(tmp_path: Path, monkeypatch):
    """`flsuite fit --resume` under other code (decision in flsuite.provenance): environment.json keeps the code that
    began the run and appends the resume's; such a run is not reused and is named as made by both."""
    from tests.federation.test_run import CrashAtRound
    from tests.helpers import head_federation

    with pytest.raises(KeyboardInterrupt):
        head_federation(tmp_path / "run", executor=CrashAtRound(3)).fit()
    env_file = tmp_path / "run" / "environment.json"
    started = json.loads(env_file.read_text())
    start_code = started["code"] = CLEAN
    env_file.write_text(json.dumps(started))  # as if code aaaa… began it
    resuming = CLEAN | {"commit": "b" * 40}
    monkeypatch.setattr("flsuite.run_environment.code_version", lambda: resuming)
    head_federation(None).fit(resume=tmp_path / "run")
    env = json.loads(env_file.read_text())
    assert env["code"] == start_code and env["argv"] == started["argv"] and env["seed"] == started["seed"]
    assert [(r["code"], r["phase"], r["round"]) for r in env["resumes"]] == [(resuming, 0, 2)]
    # the CPU's vector instructions decide the last bits of a CPU run: the start's and each resume's recorded
    capability = torch.backends.cpu.get_cpu_capability()
    assert started["cpu_capability"] == env["resumes"][0]["cpu_capability"] == capability
    assert provenance.recorded_code(tmp_path / "run") == start_code | {"resumed_by": ["bbbbbbbbbb"]}
    decision = same_experiment(tmp_path / "run", "{}", CLEAN)
    assert (
        not decision.same
        and "it was resumed under other code than it began with (aaaaaaaaaa, resumed by bbbbbbbbbb)" in decision.reason
    )
    assert "aaaaaaaaaa, resumed by bbbbbbbbbb (1 run)" in code_mix([provenance.recorded_code(tmp_path / "run"), CLEAN])


def test_a_resume_under_the_same_code_leaves_the_run_reusable(tmp_path: Path):
    env = {"seed": 0, "code": CLEAN, "resumes": [{"code": dict(CLEAN), "phase": 0, "round": 4}]}
    run = run_folder(tmp_path / "a", CONFIG, None)
    (run / "environment.json").write_text(json.dumps(env))
    assert provenance.recorded_code(run) == CLEAN
    assert same_experiment(run, yaml.safe_dump(CONFIG), CLEAN).same
