"""Mutants of the target functions, made with Cosmic Ray's operators.

The rule: a mutant is one Cosmic Ray mutation (``operator``, ``occurrence``:
the occurrence-th position where that operator applies in the file, counted
as Cosmic Ray counts them) whose changed lines all lie in a target
function's body (:mod:`mutate.targets`), whose mutated file still compiles,
and which changes the text. It is kept as a unified diff against the
release's ``vllm/`` tree (``a/vllm/<file>``), the format
``engine_adapter.host.builds`` applies. No AST mutator of kvspec's own: the
mutation itself is Cosmic Ray's ``mutate_code``.

Which mutants are run: every candidate, sorted by a seeded shuffle, picked
round-robin over the areas (so ``-n 10`` reaches every area), or the ones
``only`` names. A mutant's id is ``<area>-<8 hex>``: the sha256 of its file,
operator and occurrence, stable across runs and selections.
"""

from __future__ import annotations

import difflib
import hashlib
import random
from pathlib import Path

from ground.errors import invalid
from mutate.targets import AREAS, Span, span_at, spans

#: Cosmic Ray operator families used (prefixes of ``core/`` names). Left out:
#: the bit-operator and power replacements (no bit arithmetic in the
#: targets), ``Is``/``IsNot`` swaps of value comparisons, exception,
#: decorator and variable insertion operators (they mostly make code that
#: cannot run, counted as crashes, not as faults a checker misses).
OPERATOR_PREFIXES = (
    "core/NumberReplacer",
    "core/ReplaceComparisonOperator_",
    "core/ReplaceBinaryOperator_Add_Sub",
    "core/ReplaceBinaryOperator_Sub_Add",
    "core/ReplaceBinaryOperator_Add_Mul",
    "core/ReplaceBinaryOperator_Mul_Add",
    "core/ReplaceBinaryOperator_Mul_FloorDiv",
    "core/ReplaceBinaryOperator_FloorDiv_Mul",
    "core/ReplaceBinaryOperator_Mod_FloorDiv",
    "core/ReplaceBinaryOperator_FloorDiv_Mod",
    "core/ReplaceBinaryOperator_Sub_Mul",
    "core/ReplaceBinaryOperator_Mod_Mul",
    "core/AddNot",
    "core/ReplaceAndWithOr",
    "core/ReplaceOrWithAnd",
    "core/ReplaceTrueWithFalse",
    "core/ReplaceFalseWithTrue",
    "core/ReplaceBreakWithContinue",
    "core/ReplaceContinueWithBreak",
    "core/ZeroIterationForLoop",
    "core/ReplaceUnaryOperator_USub_UAdd",
)
_SKIP = ("_Is", "_IsNot")


def operator_names() -> list[str]:
    """The Cosmic Ray operators kvspec mutate uses (installed ones only)."""
    from cosmic_ray.plugins import operator_names as all_names

    out = []
    for name in sorted(all_names()):
        if any(name.startswith(p) for p in OPERATOR_PREFIXES) and not any(
            name.endswith(s) or f"{s}_" in name[len("core/ReplaceComparisonOperator") :] for s in _SKIP
        ):
            out.append(name)
    return out


def mutant_id(area: str, file: str, operator: str, occurrence: int) -> str:
    digest = hashlib.sha256(f"{file}\0{operator}\0{occurrence}".encode()).hexdigest()[:8]
    return f"{area}-{digest}"


def unified_diff(file: str, before: str, after: str) -> str:
    """``after`` as a diff against ``before``, paths ``a/vllm/<file>``."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/vllm/{file}", f"b/vllm/{file}", n=3
    )
    return "".join(lines)


def _changed_lines(before: list[str], after: list[str]) -> list[int]:
    """1-based lines of ``before`` that ``after`` changes (replace/delete);
    an insertion counts as the line it lands before."""
    out = []
    sm = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, i1, i2, _j1, _j2 in sm.get_opcodes():
        if tag != "equal":
            out += list(range(i1 + 1, max(i2, i1 + 1) + 1))
    return out


def positions_of_file(vllm_root: Path, file: str, file_spans: list[Span], operators: list[str]) -> list[dict]:
    """Every position (operator, occurrence) of one file that starts in a
    target span's body: cheap (no mutation is made yet)."""
    from cosmic_ray.ast import ast_nodes, get_ast
    from cosmic_ray.plugins import get_operator

    code = (Path(vllm_root) / file).read_text()
    nodes = list(ast_nodes(get_ast(code)))
    out = []
    for name in operators:
        op = get_operator(name)()
        occurrence = -1
        for node in nodes:
            for start, _end in op.mutation_positions(node):
                occurrence += 1
                span = span_at(file_spans, file, start[0])
                if span is not None:
                    out.append(
                        {
                            "id": mutant_id(span.area, file, name, occurrence),
                            "area": span.area,
                            "file": file,
                            "function": span.function,
                            "operator": name,
                            "occurrence": occurrence,
                            "line": start[0],
                        }
                    )
    return out


def positions(vllm_root: Path, operators: list[str] | None = None) -> list[dict]:
    """Every candidate position of every target (sorted by file, line,
    operator, occurrence)."""
    all_spans = spans(vllm_root)
    ops = operators or operator_names()
    out: list[dict] = []
    for file in dict.fromkeys(s.file for s in all_spans):
        out += positions_of_file(vllm_root, file, [s for s in all_spans if s.file == file], ops)
    out.sort(key=lambda m: (m["file"], m["line"], m["operator"], m["occurrence"]))
    return out


def materialize(vllm_root: Path, pos: dict, all_spans: list[Span] | None = None) -> dict | None:
    """The mutant at one position (``pos`` plus ``before``, ``after`` and
    ``diff``), or None when the mutation changes nothing, reaches outside
    the function's body or does not compile."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    all_spans = all_spans if all_spans is not None else spans(vllm_root)
    file = pos["file"]
    span = span_at(all_spans, file, pos["line"])
    if span is None:
        return None
    code = (Path(vllm_root) / file).read_text()
    mutated = mutate_code(code, get_operator(pos["operator"])(), pos["occurrence"])
    if mutated is None or mutated == code:
        return None
    lines, new_lines = code.splitlines(keepends=True), mutated.splitlines(keepends=True)
    changed = _changed_lines(lines, new_lines)
    if not changed or not all(span.body_start <= n <= span.end for n in changed):
        return None
    try:
        compile(mutated, file, "exec")
    except (SyntaxError, ValueError):
        return None
    line = changed[0]
    return {
        **pos,
        "line": line,
        "before": lines[line - 1].strip(),
        "after": new_lines[line - 1].strip() if line - 1 < len(new_lines) else "",
        "diff": unified_diff(file, code, mutated),
    }


def select(
    vllm_root: Path, cands: list[dict], *, n: int | None = None, only: list[str] | None = None, seed: int = 1
) -> list[dict]:
    """The mutants to run, materialized: ``only``: those ids, in that order
    (an unknown id, or one that makes no valid mutant, is one line);
    otherwise ``n`` (all when None) picked round-robin over the areas from a
    seeded shuffle of the positions, skipping positions that make no valid
    mutant."""
    all_spans = spans(vllm_root)
    if only:
        by_id = {m["id"]: m for m in cands}
        out = []
        for i in only:
            m = materialize(vllm_root, by_id[i], all_spans) if i in by_id else None
            if m is None:
                raise invalid(
                    "--only",
                    i,
                    f"not a valid mutant of the targets; allowed: one of the ids `kvspec mutate --list` prints ({len(by_id)} positions)",
                )
            out.append(m)
        return out
    rng = random.Random(seed)
    queues = {a: [m for m in cands if m["area"] == a] for a in AREAS}
    for q in queues.values():
        rng.shuffle(q)
    out = []
    total = len(cands) if n is None else min(n, len(cands))
    while len(out) < total and any(queues.values()):
        for a in AREAS:
            while queues[a] and len(out) < total:
                m = materialize(vllm_root, queues[a].pop(0), all_spans)
                if m is not None:
                    out.append(m)
                    break
    return out
