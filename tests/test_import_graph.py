"""The package's imports point down and never come back round (docs/architecture.md, section 1).

Every ``import`` / ``from ... import`` of an ``acare_ray`` module, at module level or inside a
function, is an edge. ``from package import submodule`` counts as an edge to the submodule only
(a package is imported before any of its modules anyway).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import acare_ray

PACKAGE = Path(acare_ray.__file__).parent
# Layers, lowest first: a module may import its own layer and those below.
LAYERS = [
    ("acare_ray.scoring",),
    (
        "acare_ray.eval.ir_metrics",
        "acare_ray.eval.bands",
        "acare_ray.data.schema",
        "acare_ray.ranking.fusion",
        "acare_ray.eval.splits",
        "acare_ray.ranking.fusion_fit",
        "acare_ray.ranking.calibration",
    ),
    ("acare_ray.eval.session_replay", "acare_ray.data", "acare_ray.ranking.checkpoint_settings"),
    ("acare_ray.search", "acare_ray.training"),  # HTTP-free retrievers and memory; the trainer
    ("acare_ray.online", "acare_ray.offline", "acare_ray.clients.http_client"),  # the app, the jobs
    # above them: what uses them (the agent loop, adopt, MCP, adapters, testing and the CLIs)
]
# Names every command module defines (the CLI protocol), so they repeat by design.
PROTOCOL_NAMES = {"register", "run", "main"}
# The only modules outside training/ that may import it: the commands that run training.
TRAINING_USERS = (
    "acare_ray.cli.demo",
    "acare_ray.cli",
    "acare_ray.adopt.config",
    "acare_ray.adopt.stages",
)


def modules() -> dict[str, Path]:
    out = {}
    for file in PACKAGE.rglob("*.py"):
        parts = ("acare_ray", *file.relative_to(PACKAGE).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, file in known.items():
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("acare_ray"):
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = {t for t in subs if t in known}
                if len(targets) < len(subs):
                    targets.add(node.module)
            elif isinstance(node, ast.Import):
                targets = {a.name for a in node.names if a.name.startswith("acare_ray")}
            else:
                continue
            graph[name] |= {t for t in targets if t in known and t != name}
    return graph


def layer(module: str) -> int:
    for level, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    return len(LAYERS)


def test_no_module_imports_a_layer_above_its_own():
    upward = [
        f"{name} -> {target}"
        for name, targets in import_graph().items()
        for target in targets
        if layer(target) > layer(name)
    ]
    assert upward == []


def test_the_import_graph_has_no_cycles():
    graph = import_graph()
    done: set[str] = set()
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycles.append(path[path.index(node) :] + [node])
            return
        if node in done:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, [*path, node])
        done.add(node)

    for module in sorted(modules()):
        visit(module, [])
    assert cycles == []


def test_only_the_commands_that_train_import_the_trainer():
    users = sorted(
        name
        for name, targets in import_graph().items()
        if not name.startswith("acare_ray.training")
        and any(t.startswith("acare_ray.training") for t in targets)
    )
    assert users and set(users) <= set(TRAINING_USERS), users


def test_the_graph_sees_real_imports():
    """The scan itself: it finds edges the code certainly has (else the tests above are empty)."""
    graph = import_graph()
    assert "acare_ray.scoring.scorer" in graph["acare_ray.offline.score"] or (
        "acare_ray.scoring" in graph["acare_ray.offline.score"]
    )
    assert "acare_ray.scoring.causal.load" in graph["acare_ray.scoring.causal.backend"]
    assert layer("acare_ray.online.service") == 4
    assert layer("acare_ray.clients.mcp_server") == len(LAYERS)
    assert "acare_ray.online.search_routes" in graph["acare_ray.online.deployment"]


def test_every_module_lives_in_a_folder_that_says_what_it_holds():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert loose == []


def test_no_two_public_classes_or_functions_share_a_name():
    """A name says which thing it is without its module: ``Search`` is the data model's only."""
    defined: dict[str, list[str]] = defaultdict(list)
    for name, file in modules().items():
        for node in ast.parse(file.read_text()).body:
            kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            if isinstance(node, kinds) and not node.name.startswith("_"):
                defined[node.name].append(name)
    shared = {
        n: where for n, where in defined.items() if len(where) > 1 and n not in PROTOCOL_NAMES
    }
    assert shared == {}


def test_every_name_imported_from_the_package_exists():
    """Imports inside functions run late (a report stage an hour into a run): each name any
    module, test or benchmark takes from an ``acare_ray`` module must be there now."""
    import importlib

    roots = [PACKAGE, PACKAGE.parent / "tests", PACKAGE.parent / "benchmarks"]
    missing = []
    for root in roots:
        for file in root.rglob("*.py"):
            if "fixtures" in file.parts:
                continue
            for node in ast.walk(ast.parse(file.read_text())):
                if not isinstance(node, ast.ImportFrom) or node.level:
                    continue
                if not (node.module or "").startswith("acare_ray"):
                    continue
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if alias.name == "*" or hasattr(module, alias.name):
                        continue
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ModuleNotFoundError:
                        missing.append(f"{file.name}: from {node.module} import {alias.name}")
    assert missing == []
