"""The package's shape (docs/architecture.md): layers import only downwards, no import cycles, no file over 300 lines,
and every `class_path` a shipped config or a doc names still resolves."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "flsuite"
METHODS = "flsuite.methods"
MAX_LINES = 300
#: The module docs/architecture.md's "how to add a method" asks a user to create (run by tests/test_add_a_method.py).
EXAMPLE = "flsuite.methods.fedexample.FedExample"

#: Layers, lowest first: a module may import its own layer and the ones below, never one above.
LAYERS = [
    ("bottom", ("seeding", "paths", "progress", "interrupts", "runtime", "records", "plots")),
    ("data and models", ("data", "models")),
    (
        "run services",
        ("metrics", "tracking", "run_environment", "runfolder", "code_identity", "provenance", "preflight"),
    ),
    ("engine", ("federation",)),
    ("methods", ("methods",)),
    (
        "tools",
        ("cli", "cli_parsers", "config_files", "config_errors", "fit_data", "pool", "sweep", "compare", "dashboard"),
    ),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    if module == "flsuite":  # the package's __init__: its version only
        return 0
    top = module.split(".")[1]
    for rank, (_, names) in enumerate(LAYERS):
        if top in names:
            return rank
    return len(LAYERS)  # anything unlisted: above every layer (a new top-level module must be placed)


def _resolve(target: str, known: dict[str, Path]) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(known: dict[str, Path]) -> dict[str, list[tuple[str, bool]]]:
    """module → [(imported flsuite module, whether only under TYPE_CHECKING)], from the code's own import statements."""
    out: dict[str, list[tuple[str, bool]]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = _type_checking_lines(tree)
        found: list[tuple[str, bool]] = []
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            for target in targets:
                if target.startswith("flsuite"):
                    resolved = _resolve(target, known)
                    if resolved and resolved != name:
                        found.append((resolved, node.lineno in typing_only))
        out[name] = found
    return out


def test_no_module_imports_a_layer_above_its_own():
    known = modules()
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0] if layer_of(t) < len(LAYERS) else 'top'})"
        for m, targets in imports(known).items()
        for t, _ in targets
        if layer_of(t) > layer_of(m)
    ]
    assert upward == []


def test_models_never_import_data_and_the_engine_never_imports_methods():
    """The issue's rules by name, so they hold whatever LAYERS says (models and data share a layer)."""
    graph = imports(modules())

    def edges(source: str, target: str) -> list[tuple[str, str]]:
        return [(m, t) for m, ts in graph.items() if m.startswith(source) for t, _ in ts if t.startswith(target)]

    assert edges("flsuite.models", "flsuite.data") == edges("flsuite.federation", "flsuite.methods") == []
    assert edges("flsuite.data", "flsuite.federation") == []
    assert [
        (m, t) for m, ts in graph.items() if layer_of(m) < layer_of("flsuite.cli") for t, _ in ts if t == "flsuite.cli"
    ] == []


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """A cycle in `graph` (as the modules along it, first repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": [], "c": ["a", "b"]}) is None


def test_no_import_cycles():
    """Runtime imports only (module-level and inside functions); an import under `if TYPE_CHECKING:` never runs."""
    graph = {m: sorted({t for t, typing_only in ts if not typing_only}) for m, ts in imports(modules()).items()}
    graph = {m: [t for t in ts if not m.startswith(f"{t}.")] for m, ts in graph.items()}  # a package's own __init__
    assert find_cycle(graph) is None


def test_no_import_cycle_inside_the_methods_even_at_type_level():
    """Inside `methods/` an import under `if TYPE_CHECKING:` counts too, and so does a module's import of its own
    package's `__init__` (which imports the module): a method's modules import downwards only (FKPL's package:
    settings and the math at the bottom, the phases above them, `FKPL` in `__init__` on top)."""
    graph = {
        m: sorted({t for t, _ in ts if t.startswith(METHODS)})
        for m, ts in imports(modules()).items()
        if m.startswith(METHODS)
    }
    assert find_cycle(graph) is None


def test_the_type_level_cycle_check_sees_an_import_under_type_checking(tmp_path, monkeypatch):
    """The check above on a made-up method package shaped as FKPL was before issue 34: the method (`__init__`) imports
    its phase at run time, the phase imports the method only under TYPE_CHECKING."""
    package = tmp_path / "flsuite" / "methods" / "made_up"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from flsuite.methods.made_up.phase import Stage\n")
    (package / "phase.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from flsuite.methods.made_up import Method\n"
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path / "flsuite")
    made_up = "flsuite.methods.made_up"
    assert imports(modules()) == {made_up: [(f"{made_up}.phase", False)], f"{made_up}.phase": [(made_up, True)]}
    with pytest.raises(AssertionError):
        test_no_import_cycle_inside_the_methods_even_at_type_level()
    (package / "phase.py").write_text("")
    test_no_import_cycle_inside_the_methods_even_at_type_level()


#: The engine's one circle at type level (issue 34): a phase runs with a `RunContext`, which runs nested phases.
ENGINE_CIRCLE = {"flsuite.federation.phases", "flsuite.federation.context"}


def components(graph: dict[str, list[str]]) -> list[set[str]]:
    """The strongly connected components of `graph` of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, []):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set(stack[stack.index(node) :])
            del stack[stack.index(node) :]
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_component_finder_finds_the_circles():
    assert components({"a": ["b"], "b": ["c", "d"], "c": ["a"], "d": ["e"], "e": ["d"], "f": ["a"]}) == [
        {"d", "e"},
        {"a", "b", "c"},
    ]
    assert components({"a": ["b"], "b": [], "c": ["a", "b"]}) == []


def test_the_engine_circles_only_through_phases_and_context_even_at_type_level():
    """Imports under `if TYPE_CHECKING:` counted, and a module's import of its own package's `__init__` dropped (as
    `test_no_import_cycles` does), the engine's one circle is `phases` <-> `context` (or none): a lower module that
    needs a higher one's type declares what it needs as a `typing.Protocol` the higher class satisfies
    (`server_context.ServerContext`, `server.StepRun`, `query.QueryEnvironment`, `phases.OwnProtocol`)."""
    graph = {m: sorted({t for t, _ in ts}) for m, ts in imports(modules()).items()}
    graph = {m: [t for t in ts if not m.startswith(f"{t}.")] for m, ts in graph.items()}
    engine = [c for c in components(graph) if any(m.startswith("flsuite.federation") for m in c)]
    assert engine in ([], [ENGINE_CIRCLE])


def test_the_engine_circle_check_sees_a_circle_closed_under_type_checking(tmp_path, monkeypatch):
    """The check above on a made-up engine shaped as it was before issue 34: the method contract imports the phases
    under TYPE_CHECKING (`Method.protocol() -> list[Phase]`), and the run context imports the method at run time."""
    engine = tmp_path / "flsuite" / "federation"
    engine.mkdir(parents=True)
    (engine / "__init__.py").write_text("")
    typing_only = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from flsuite.federation.{} import {}\n"
    (engine / "context.py").write_text(
        "from flsuite.federation.method import Method\n" + typing_only.format("phases", "Phase")
    )
    (engine / "phases.py").write_text(typing_only.format("context", "RunContext"))
    (engine / "method.py").write_text(typing_only.format("phases", "Phase"))
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path / "flsuite")
    assert imports(modules())["flsuite.federation.method"] == [("flsuite.federation.phases", True)]
    with pytest.raises(AssertionError):
        test_the_engine_circles_only_through_phases_and_context_even_at_type_level()
    (engine / "method.py").write_text("")
    test_the_engine_circles_only_through_phases_and_context_even_at_type_level()
    (engine / "phases.py").write_text("")
    test_the_engine_circles_only_through_phases_and_context_even_at_type_level()


def test_every_function_of_fkpl_is_under_40_lines():
    """FKPL's package reads in short functions (issue 34): decorators to the last line, signatures and docstrings
    included."""
    long = {}
    for path in sorted((PACKAGE / "methods" / "fkpl").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if (n := (node.end_lineno or node.lineno) - first + 1) >= 40:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert long == {}


def test_no_file_in_the_package_is_over_300_lines():
    long = {
        str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def class_paths() -> set[str]:
    """Every dotted `class_path` in the shipped configs, the docs and the README."""
    found: set[str] = set()
    texts = [p.read_text() for p in [*ROOT.glob("configs/**/*.yaml"), *ROOT.glob("docs/**/*.md"), ROOT / "README.md"]]
    for text in texts:
        found.update(re.findall(r"class_path:\s*[\"']?(flsuite\.[\w.]+)", text))
    return found - {EXAMPLE}


def test_every_class_path_in_configs_and_docs_resolves():
    paths = class_paths()
    assert len(paths) > 30  # the configs name the methods, data sources, partitions, encoders, phases, steps
    broken = []
    for path in sorted(paths):
        module, _, name = path.rpartition(".")
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            broken.append(f"{path}: {err}")
    assert broken == []


#: Public members of the contract that are the engine's, not hooks a method overrides or declares (issue 34).
ENGINE_OWNED = {
    "ClientModule": {"forward", "step_hooks"},  # nn.Module's call; derived from which step hooks a class overrides
    "Method": {
        "num_clients",
        "parameter_names",
        "transport",
        "travelling",
        "bytes_down",
        "bytes_up",
    },  # set by setup; accounting
}


def _public_members(cls: str) -> set[str]:
    tree = ast.parse((PACKAGE / "federation" / "method.py").read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    names = {n.name for n in body if isinstance(n, ast.FunctionDef)}
    names |= {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    names |= {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    return {n for n in names if not n.startswith("_")}


def test_the_hook_table_lists_every_public_hook_of_the_contract():
    """docs/architecture.md's hook table names every public member of `ClientModule` and `Method` that a method
    overrides or declares (the engine's own members are listed above, each with its reason)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc[doc.index("| hook | called |") :].split("\n\n", 1)[0]
    first_cells = " ".join(row.split("|")[1] for row in table.splitlines()[2:])
    for cls in ("ClientModule", "Method"):
        hooks = _public_members(cls) - ENGINE_OWNED[cls]
        missing = sorted(h for h in hooks if not re.search(rf"\b{h}\b", first_cells))
        assert missing == [], f"docs/architecture.md's hook table lacks {cls}: {missing}"
        assert ENGINE_OWNED[cls] <= _public_members(cls), "an engine-owned name no longer exists: update ENGINE_OWNED"
