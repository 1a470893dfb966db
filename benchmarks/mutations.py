"""Mutations of the engine and the methods that the test suite must kill (issue 33: "each shrunk test must still fail
when the code it guards is broken"): each mutation is an exact source edit (one occurrence of `old` in `file`
replaced by `new`) with the tests that must fail under it.

    python benchmarks/mutations.py [--commit REV] [--only NAME ...] [--out FILE.md] [--list]

The commit is checked out as a detached `git worktree` in a temporary folder (removed at the end, also on Ctrl-C);
every pytest run there imports that worktree's `flsuite` (PYTHONPATH first; checked once and printed), never the
installed checkout. The selected mutations' tests first run unmutated and must pass (else the tool stops); then each
mutation is applied, its tests run with `-x`, and the file is restored. Verdicts:

- KILLED: pytest exited 1 with a failing (or erroring) test: the first one and its duration are shown;
- SURVIVED: every selected test passed under the mutation: no test guards that behaviour;
- INVALID: a collection or import error, an interrupted run or no test collected (exit 2-5), or a run that failed
  with errors during collection only: the mutation proves nothing (e.g. a test id renamed since).

The Markdown table goes to stdout and to `--out`. Exit status: 0 when every mutation was killed, 1 otherwise.
Keep each mutation's tests small (the files that test that code), so the whole list runs in minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    """One exact edit of `file` (relative to the repository root) and the tests that must kill it.

    `old` must occur exactly once in `file`; `tests` are pytest arguments (files, folders or node ids) run in order
    with `-x`, so put the quickest killer first."""

    name: str
    file: str
    old: str
    new: str
    breaks: str
    tests: tuple[str, ...]


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        name="aggregation-uniform-weights",
        file="flsuite/federation/weights.py",
        old="acc += w[name].to(torch.float64) * (float(c) / total)",
        new="acc += w[name].to(torch.float64) * (1.0 / len(weights))",
        breaks="weighted_average ignores its coefficients: FedAvg averages uniformly, not ∝ client samples",
        tests=("tests/federation/test_run.py",),
    ),
    Mutation(
        name="scaffold-correction-sign",
        file="flsuite/methods/scaffold.py",
        old="self._correction = {n: self._c[n] - self._c_i[n] for n in params}",
        new="self._correction = {n: self._c_i[n] - self._c[n] for n in params}",
        breaks="SCAFFOLD's gradient correction is c_k − c instead of c − c_k (sign flipped)",
        tests=("tests/methods/test_baselines.py",),
    ),
    Mutation(
        name="fedprox-proximal-sign",
        file="flsuite/methods/fedprox.py",
        old="return ce + 0.5 * self.method.mu * prox",
        new="return ce - 0.5 * self.method.mu * prox",
        breaks="FedProx's proximal term μ/2‖w − w_global‖² is subtracted: it pushes away from the global model",
        tests=("tests/methods/test_baselines.py", "tests/methods/test_fednova_feddc.py"),
    ),
    Mutation(
        name="round-loop-off-by-one",
        file="flsuite/federation/phases.py",
        old="for rnd in range(state.round + 1, rounds + 1):",
        new="for rnd in range(state.round + 1, rounds):",
        breaks="the round loop stops one round early (rounds − 1 rounds run, the last one never)",
        tests=("tests/federation/test_run.py", "tests/federation/test_phases.py"),
    ),
    Mutation(
        name="scaffold-client-state-dropped",
        file="flsuite/methods/scaffold.py",
        old='return {"c_i": self._new_c_i}',
        new="return {}",
        breaks="SCAFFOLD's client state loses its key c_i: c_k⁺ is not kept, every round restarts from c_k = 0",
        tests=("tests/methods/test_baselines.py",),
    ),
    Mutation(
        name="gradient-offset-skipped",
        file="flsuite/federation/local/steps.py",
        old="            p.grad.add_(offset)",
        new="            pass",
        breaks="the lean/standard loops never add the method's gradient_offset (SCAFFOLD's c − c_k) to .grad",
        tests=(
            "tests/federation/local/test_compiled.py::test_a_gradient_offset_is_folded_into_the_scanned_steps",
            "tests/methods/test_baselines.py",
        ),
    ),
    Mutation(
        name="fednova-no-normalisation",
        file="flsuite/methods/fednova.py",
        old="step = sum(pk * (x - r.weights[name].to(torch.float64)) / ak for pk, ak, r in zip(p, a, results))",
        new="step = sum(pk * (x - r.weights[name].to(torch.float64)) for pk, ak, r in zip(p, a, results))",
        breaks="FedNova does not divide each client's update by its a_k (normalised averaging lost)",
        tests=("tests/methods/test_fednova_feddc.py",),
    ),
    Mutation(
        name="ggeur-covariance-within-only",
        file="flsuite/methods/ggeur.py",
        old="return ClassStatistics(total, mean, (within + between) / total)",
        new="return ClassStatistics(total, mean, within / total)",
        breaks="GGEUR's global class covariance (Eq. 4) drops the between-client term of the pooled covariance",
        tests=("tests/methods/test_ggeur.py",),
    ),
    Mutation(
        name="fkpl-mixing-ignores-b",
        file="flsuite/methods/fkpl/prototypes.py",
        old="lam = self.a + (self.b - self.a) * torch.rand(n, 1, generator=gen)",
        new="lam = self.a + (1.0 - self.a) * torch.rand(n, 1, generator=gen)",
        breaks="FKPL's mixing weight λ ~ U(a, 1) ignores the upper bound b (Eq. 10)",
        tests=("tests/methods/test_fkpl_stage2.py",),
    ),
    Mutation(
        name="fedegg-gate-non-strict",
        file="flsuite/methods/fedegg_equations.py",
        old="return llr(loss_c, loss_g) < tau",
        new="return llr(loss_c, loss_g) <= tau",
        breaks="FedEGG's gate (Eq. 8) opens at log₂(L^c/L^g) = τ (non-strict comparison)",
        tests=("tests/methods/test_fedegg.py",),
    ),
    Mutation(
        name="checkpoint-resumes-a-round-early",
        file="flsuite/federation/checkpoint.py",
        old='round=int(payload["round"]),',
        new='round=int(payload["round"]) - 1,',
        breaks="a loaded checkpoint claims one round fewer: resume recomputes the last round from its own result",
        tests=("tests/federation/test_run.py", "tests/federation/test_client_states.py"),
    ),
)

PYTEST = ("-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider")
#: The test environment of the README (no network, no W&B server, no Ray telemetry, no display).
QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "RAY_USAGE_STATS_ENABLED": "0",
    "MPLBACKEND": "Agg",
}


@dataclass
class Outcome:
    mutation: Mutation
    verdict: str  # KILLED, SURVIVED, INVALID
    killed_by: str
    test_seconds: float | None
    seconds: float


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def check_snippets(tree: Path, mutations: Sequence[Mutation]) -> None:
    """Every `old` occurs exactly once in its file at this commit, else stop naming the mutation."""
    problems = []
    for m in mutations:
        path = tree / m.file
        if not path.is_file():
            problems.append(f"{m.name}: {m.file} does not exist at this commit")
            continue
        count = path.read_text(encoding="utf-8").count(m.old)
        if count != 1:
            problems.append(
                f"{m.name}: its `old` snippet occurs {count} times in {m.file} (must be exactly once): {m.old!r}"
            )
        if m.old == m.new:
            problems.append(f"{m.name}: `new` equals `old`")
    if problems:
        raise SystemExit("refused:\n  " + "\n  ".join(problems))


def test_env(tree: Path) -> dict[str, str]:
    env = {**os.environ, **QUIET_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no .pyc of a mutated file can outlive its restoration
    env.pop("PYTEST_ADDOPTS", None)
    return env


def imported_flsuite(tree: Path) -> Path:
    out = subprocess.run(
        [sys.executable, "-c", "import flsuite; print(flsuite.__file__)"],
        cwd=tree,
        env=test_env(tree),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Path(out.strip().splitlines()[-1]).resolve()


def first_problem(junit: Path, tree: Path) -> tuple[str, float | None, bool]:
    """(node id, seconds, at collection) of the first failed or erroring test case in a JUnit XML report."""
    if not junit.is_file():
        return "", None, False
    for case in ET.parse(junit).getroot().iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is None:
            continue
        classname, name = case.get("classname", ""), case.get("name", "")
        collection = not name or (problem.get("message") or "").startswith("collection failure")
        parts = classname.split(".")
        # classname "tests.methods.test_x" (module) or "tests.methods.test_x.TestClass"
        for cut in range(len(parts), 0, -1):
            if tree.joinpath(*parts[:cut]).with_suffix(".py").is_file():
                node = (
                    "/".join(parts[:cut])
                    + ".py"
                    + "".join(f"::{p}" for p in parts[cut:])
                    + (f"::{name}" if name else "")
                )
                break
        else:
            node = f"{classname}::{name}"
        return node, float(case.get("time", "0") or 0), collection
    return "", None, False


def run_pytest(tree: Path, args: Sequence[str], junit: Path, stop_first: bool) -> tuple[int, str, float]:
    start = time.perf_counter()
    cmd = [
        sys.executable,
        *PYTEST,
        *(["-x"] if stop_first else []),
        f"--junitxml={junit}",
        "-o",
        "junit_family=xunit1",
        *args,
    ]
    proc = subprocess.run(cmd, cwd=tree, env=test_env(tree), capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start


def last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_mutation(tree: Path, m: Mutation, junit: Path) -> Outcome:
    path = tree / m.file
    original = path.read_text(encoding="utf-8")
    try:
        path.write_text(original.replace(m.old, m.new, 1), encoding="utf-8")
        code, output, seconds = run_pytest(tree, m.tests, junit, stop_first=True)
    finally:
        path.write_text(original, encoding="utf-8")
    node, test_seconds, collection = first_problem(junit, tree)
    if code == 0:
        return Outcome(m, "SURVIVED", "—", None, seconds)
    if code == 1 and node and not collection:
        kind = "" if "error" not in last_line(output) or "failed" in last_line(output) else " (error)"
        return Outcome(m, "KILLED", f"`{node}`{kind}", test_seconds, seconds)
    return Outcome(m, "INVALID", f"exit {code}: {last_line(output)[:160]}", test_seconds, seconds)


def table(outcomes: Sequence[Outcome], commit: str) -> str:
    rows = [
        f"Mutations at {commit}: {sum(o.verdict == 'KILLED' for o in outcomes)} of {len(outcomes)} killed.",
        "",
        "| mutation | file | what it breaks | verdict | killed by (first failing test, its seconds) | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        by = o.killed_by + (
            f" ({o.test_seconds:.2f} s)" if o.verdict == "KILLED" and o.test_seconds is not None else ""
        )
        rows.append(
            f"| {o.mutation.name} | `{o.mutation.file}` | {o.mutation.breaks} | {o.verdict} | {by} | {o.seconds:.1f} |"
        )
    return "\n".join(rows) + "\n"


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def baseline_args(mutations: Sequence[Mutation]) -> list[str]:
    """The union of the mutations' tests, each once (a node id inside a whole file already listed is dropped)."""
    args = list(dict.fromkeys(t for m in mutations for t in m.tests))
    whole = {a for a in args if "::" not in a}
    return [
        a
        for a in args
        if "::" not in a or not any(a.split("::")[0] == w or a.startswith(w.rstrip("/") + "/") for w in whole)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--commit", default="HEAD", help="the revision to mutate (default HEAD)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = parser.parse_args(argv)

    mutations = list(MUTATIONS)
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in mutations})
        if unknown:
            parser.error(f"unknown mutation(s) {unknown}; known: {[m.name for m in mutations]}")
        mutations = [m for m in mutations if m.name in args.only]
    if args.list:
        for m in mutations:
            print(f"{m.name}: {m.file}: {m.breaks}\n    tests: {' '.join(m.tests)}")
        return 0

    commit = git("rev-parse", "--verify", f"{args.commit}^{{commit}}")
    short = git("rev-parse", "--short", commit)
    scratch = Path(tempfile.mkdtemp(prefix="flsuite-mutations-"))
    tree = scratch / "tree"
    signal.signal(signal.SIGTERM, interrupted)  # a kill cleans up as Ctrl-C does
    try:
        git("worktree", "add", "--detach", str(tree), commit)
        check_snippets(tree, mutations)
        where = imported_flsuite(tree)
        print(f"commit {short}; flsuite imported from {where}", flush=True)
        if not where.is_relative_to(tree.resolve()):
            raise SystemExit(f"stopped: the tests would import {where}, not the worktree's flsuite (check PYTHONPATH)")

        junit = scratch / "report.xml"
        suite = baseline_args(mutations)
        print(f"unmutated: python {' '.join(PYTEST)} {' '.join(suite)}", flush=True)
        code, output, seconds = run_pytest(tree, suite, junit, stop_first=False)
        print(f"unmutated: exit {code}, {last_line(output)} ({seconds:.0f} s)", flush=True)
        if code != 0:
            print(output[-6000:], file=sys.stderr)
            raise SystemExit("stopped: the unmutated tests do not pass, so no mutation can be judged")

        outcomes = []
        for m in mutations:
            outcome = run_mutation(tree, m, junit)
            if git("status", "--porcelain", "--untracked-files=no", cwd=tree):
                raise SystemExit(f"stopped: {m.file} was not restored after {m.name}")
            print(f"{m.name}: {outcome.verdict} {outcome.killed_by} ({outcome.seconds:.0f} s)", flush=True)
            outcomes.append(outcome)
    except KeyboardInterrupt:
        print("interrupted: removing the worktree", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if tree.exists():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)

    report = table(outcomes, short)
    print("\n" + report, end="")
    if args.out:
        args.out.write_text(report, encoding="utf-8")
    return 0 if all(o.verdict == "KILLED" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
