"""The house's floors, read from the code's own imports (issue 28; the
neutral home and the one atomic writer of issue 10 are tests/test_structure.py).

Floors, ground first: ``ground`` (errors, bounded file reading and the
atomic writer, kvspec's home, the console; it imports nothing else of
ours), then ``reference`` (the model and the promise), then ``spec`` and ``engine_adapter``, then
``fuzz``, then ``advise`` and ``mutate``, then the CLI ``kvspec``. An
import from a lower floor into a higher one is an arrow that runs back up;
files that import each other in a loop are a circle. Every import counts,
at module top or inside a function.

This is a ratchet: the back arrows and circles that stand today are listed
(:data:`KNOWN_BACK_ARROWS`, :data:`KNOWN_CIRCLES`: what stands on 2026-12-04, issue 28
measured), a new one fails the test, and so does a listed one that is gone
(strike it from the list: the count only goes down). Issue 28's target is
both lists empty.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ground.engines import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
FLOORS = {"ground": 0, "reference": 1, "spec": 2, "engine_adapter": 2, "fuzz": 3, "advise": 4, "mutate": 4, "kvspec": 5}

#: (importing package, imported package): arrows that run back up today.
KNOWN_BACK_ARROWS: set[tuple[str, str]] = set()

#: Circles of files today, each a sorted tuple of paths.
KNOWN_CIRCLES: set[tuple[str, ...]] = set()


def _files(root: Path) -> dict[str, Path]:
    """Module name -> file, for every module of the floors' packages."""
    out = {}
    for pkg in FLOORS:
        for path in (root / pkg).rglob("*.py"):
            if path.name.startswith("test_") or path.name == "conftest.py":
                continue  # tests in a package folder (pytest spec/) are no rooms
            rel = path.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


def _imports(path: Path, module: str, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that ``path`` imports (``from a import b`` counts
    ``a.b`` when b is a module, else ``a``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # `import a.b.c` of a non-module c: its package
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, str]]:
    modules = _files(root)
    graph = {m: _imports(p, m, modules) for m, p in modules.items()}
    rel = {m: str(p.relative_to(root)) for m, p in modules.items()}
    return graph, rel


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_new_arrow_runs_back_up_and_the_list_only_shrinks():
    graph, rel = _graph()
    arrows: dict[tuple[str, str], list[str]] = {}
    for src, targets in graph.items():
        for dst in targets:
            a, b = src.split(".")[0], dst.split(".")[0]
            if FLOORS[b] > FLOORS[a]:
                arrows.setdefault((a, b), []).append(f"{rel[src]} -> {rel[dst]}")
    new = {k: v for k, v in arrows.items() if k not in KNOWN_BACK_ARROWS}
    assert not new, f"arrows that run back up (a lower floor importing a higher one): {new}"
    gone = KNOWN_BACK_ARROWS - set(arrows)
    assert not gone, f"back arrows fixed: strike them from KNOWN_BACK_ARROWS: {sorted(gone)}"


def test_no_new_circle_of_files_and_the_list_only_shrinks():
    graph, rel = _graph()
    circles = {tuple(sorted(rel[m] for m in comp)) for comp in _circles(graph)}
    new = circles - KNOWN_CIRCLES
    assert not new, f"files that import each other in a loop: {sorted(new)}"
    gone = KNOWN_CIRCLES - circles
    assert not gone, f"circles broken: strike them from KNOWN_CIRCLES: {sorted(gone)}"


def test_the_reader_sees_a_planted_back_arrow_and_circle(tmp_path):
    """The reader itself: a package layout written here, with one arrow back
    up (inside a function) and one circle (through a relative import), is
    seen as such."""
    for pkg in FLOORS:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "reference" / "a.py").write_text("from reference import b\n")
    (tmp_path / "reference" / "b.py").write_text("def f():\n    from . import a\n    from kvspec.home import x\n")
    (tmp_path / "kvspec" / "home.py").write_text("x = 1\n")
    graph, _rel = _graph(tmp_path)
    assert graph["reference.b"] == {"reference.a", "kvspec.home"}
    assert [sorted(c) for c in _circles(graph)] == [["reference.a", "reference.b"]]


#: Where engine-package code runs (issue 28): the family (``vllm_engine``)
#: runs inside its engine's environment and may import vLLM; the host side,
#: the family-neutral inside side and the live client never import an
#: engine directly, and the family never reaches back to the host side.
#: The family packages and their engines are read from the one registry
#: (``ground.engines.FAMILIES``: each family's driver module and package).
#: The engine each family may import (its own only).
FAMILY_ENGINE = {f.driver.rpartition(".")[0]: {f.package, *f.imports} for f in FAMILIES.values()}
#: Every engine package any family imports.
ENGINE_PACKAGES = set().union(*FAMILY_ENGINE.values())
ENGINE_SIDES = {
    "engine_adapter.host": "host",
    "engine_adapter.live": "host",
    "engine_adapter.inside": "inside",
    **dict.fromkeys(FAMILY_ENGINE, "family"),
}


def _side(module: str) -> str | None:
    return next(
        (side for prefix, side in ENGINE_SIDES.items() if module == prefix or module.startswith(prefix + ".")), None
    )


def _engine_imports(path: Path) -> set[str]:
    """Top-level names of the engines a file imports (vllm, sglang)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
        found |= {n.split(".")[0] for n in names if n.split(".")[0] in ENGINE_PACKAGES}
    return found


def test_only_the_engine_family_imports_an_engine_and_nothing_inside_imports_the_host_side():
    modules = _files(ROOT)
    graph, rel = _graph()
    wrong = []
    for module, path in modules.items():
        side = _side(module)
        if side in ("host", "inside") and _engine_imports(path):
            wrong.append(
                f"{rel[module]} imports {sorted(_engine_imports(path))} (only a family, engine_adapter/vllm_engine or sglang_engine, may)"
            )
        own = next(
            (e for prefix, e in FAMILY_ENGINE.items() if module.startswith(prefix + ".") or module == prefix), None
        )
        if own and _engine_imports(path) - own:
            wrong.append(
                f"{rel[module]} imports {sorted(_engine_imports(path) - own)} (a family imports its own engine only: {sorted(own)})"
            )
        if side in ("family", "inside"):
            wrong += [
                f"{rel[module]} -> {rel[dst]} (it runs inside the engine's environment; it never imports the host side)"
                for dst in sorted(graph[module])
                if _side(dst) == "host"
            ]
    assert wrong == []
    assert {_side(m) for m in modules} >= {"host", "inside", "family"}  # the sides exist where this test looks


#: Host-side modules that may import the vLLM family, and why.
FAMILY_IMPORTS_ALLOWED = {
    "fuzz.driving.fuzz_engine": "the atheris harness runs inside the engine's environment, with vLLM in-process",
    "advise.source": "a resolution cache key names the family's resolver version (RESOLVER_VERSION, no vLLM import)",
}


def test_the_host_side_reaches_the_family_only_through_the_engine_interface():
    """The CLI, campaigns, advise and mutate talk to an engine through
    ``engine_adapter``'s host side and interface; a family's own modules
    (``engine_adapter.vllm_engine``) are imported only where listed, so a
    second family joins without touching them."""
    graph, rel = _graph()
    wrong = [
        f"{rel[src]} -> {rel[dst]}"
        for src, dsts in graph.items()
        for dst in sorted(dsts)
        if src.split(".")[0] in ("fuzz", "advise", "mutate", "kvspec")
        and _side(dst) == "family"
        and src not in FAMILY_IMPORTS_ALLOWED
    ]
    assert wrong == []
