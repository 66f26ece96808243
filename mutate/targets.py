"""The vLLM functions ``kvspec mutate`` plants faults in.

The rule: a mutant may only change a line inside one of :data:`TARGETS`'
functions (or, for a class, its methods), as the release's source defines
them. Line ranges are read from the source *text* with :mod:`ast` (the file
is parsed, never imported), so they follow each release's own layout.

The areas (issue 12): the EAGLE replay boundary and the hybrid
coordinator's longest-hit search, the Mamba manager's caching and retention,
the scheduler's align-mode prefill split, the block-size resolution and hit
alignment, and the Mamba prefill checkpoint position.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from engine_adapter.host.builds import site_packages
from engine_adapter.host.environments import env_dir
from ground.errors import EngineError

#: (area, file under vllm/, qualified name: a function, a method or a class)
TARGETS: tuple[tuple[str, str, str], ...] = (
    ("replay", "v1/core/kv_cache_coordinator.py", "replay_boundaries"),
    ("lookup", "v1/core/kv_cache_coordinator.py", "HybridKVCacheCoordinator.find_longest_cache_hit"),
    ("mamba", "v1/core/single_type_kv_cache_manager.py", "MambaManager"),
    ("split", "v1/core/sched/scheduler.py", "Scheduler._mamba_block_aligned_split"),
    ("blocks", "v1/core/kv_cache_utils.py", "resolve_kv_cache_block_sizes"),
    ("blocks", "v1/core/kv_cache_utils.py", "resolve_cache_hit_alignment_tokens"),
    ("checkpoint", "v1/kv_cache_interface.py", "get_mamba_prefill_checkpoint_position"),
    ("checkpoint", "v1/kv_cache_interface.py", "is_mamba_prefill_checkpoint_valid"),
)
AREAS = tuple(dict.fromkeys(a for a, _f, _q in TARGETS))


@dataclass(frozen=True)
class Span:
    """One target function's (or method's) lines, 1-based and inclusive, in
    ``vllm/<file>``; ``body_start`` is its first line after the ``def``
    line(s) and decorators (a mutant never touches a signature)."""

    area: str
    file: str
    function: str
    start: int
    body_start: int
    end: int


def _find(tree: ast.Module, qualname: str) -> ast.AST | None:
    node: ast.AST = tree
    for part in qualname.split("."):
        body = getattr(node, "body", [])
        found = [
            n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
        ]
        if not found:
            return None
        node = found[-1]
    return node


def _spans_of(area: str, file: str, qualname: str, node: ast.AST) -> list[Span]:
    if isinstance(node, ast.ClassDef):
        out = []
        for n in node.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out += _spans_of(area, file, f"{qualname}.{n.name}", n)
        return out
    body_start = node.body[0].lineno
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(getattr(first, "value", None), ast.Constant)
        and isinstance(first.value.value, str)
        and len(node.body) > 1
    ):
        body_start = node.body[1].lineno  # skip the docstring
    return [Span(area, file, qualname, node.lineno, body_start, node.end_lineno)]


def spans(vllm_root: Path) -> list[Span]:
    """Every target function's span in the ``vllm/`` package at
    ``vllm_root``; a target this release lacks raises EngineError (kvspec
    mutate names what it covers)."""
    out: list[Span] = []
    for area, file, qualname in TARGETS:
        path = Path(vllm_root) / file
        try:
            tree = ast.parse(path.read_text(), filename=str(path))
        except (OSError, SyntaxError) as e:
            raise EngineError(
                f"file={path}: cannot read the target source ({e}); allowed: a vLLM release with {file}"
            ) from None
        node = _find(tree, qualname)
        if node is None:
            raise EngineError(
                f"target={qualname}: not defined in {path}; allowed: a release that defines every target of mutate.targets.TARGETS"
            )
        out += _spans_of(area, file, qualname, node)
    return out


def span_at(all_spans: list[Span], file: str, line: int) -> Span | None:
    """The target span holding ``line`` of ``file`` (its body), or None."""
    for s in all_spans:
        if s.file == file and s.body_start <= line <= s.end:
            return s
    return None


def release_vllm_root(release: str) -> Path:
    """The installed ``vllm/`` package of a release's (or a build's, by its
    version ``X+LABEL.HASH``) engine environment."""

    sp = site_packages(env_dir(release))
    if sp is None or not (sp / "vllm").is_dir():
        raise EngineError(
            f"engine=vllm=={release}: no installed vllm package under {env_dir(release)}; allowed: an installed release (kvspec engines install vllm=={release})"
        )
    return sp / "vllm"
