"""``--engine`` with ``--patch`` and ``--base``: the engine options every
command that runs an engine shares (run, fuzz, replay, matrix, resolve,
report --matrix, check-build).

* ``--engine vllm==X``: a release; ``--engine vllm==X+LABEL.HASH``: a build
  made earlier (``kvspec engines list``);
* ``--engine vllm==X --patch FILE.diff [--patch ...]``: release X with the
  patches applied, in order (a ``--patch`` belongs to the ``--engine`` before
  it; before any ``--engine``, to the first one, or the default);
* ``--engine path:/src/vllm`` / ``--engine wheel:FILE.whl`` ``[--base vllm==X]``:
  a local source tree's or a wheel's Python files over release X.

:func:`parse_engine_options` reads each name once, here
(``ground.engines.EngineSpec``: the one grammar), before any work;
:func:`engine_specs` turns them into engines, building each build's
environment first (``engine_adapter.host.builds``: seconds from the
release's), and the commands hand the parsed engine down (never its
name, to be read again).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fuzz.judge.oracle_registry import BY_NAME, ORACLES, listed
from ground.engines import DEFAULT_FAMILY, FAMILIES, EngineSpec, Family

PATCH_HELP = "a unified diff against the release's vllm/ tree, applied to the --engine before it (repeatable; in order)"
BASE_HELP = "the release a path: or wheel: engine is based on (default: the tree's vllm/_version.py, read as text, or the wheel's version)"
NOTE = (
    f"a build (--patch, path:, wheel:) is judged by the {listed(o for o in ORACLES if BY_NAME[o].build)} oracles: "
    f"the {listed(o for o in ORACLES if not BY_NAME[o].build)} oracles state its release's rule, not the build's"
)


class _EngineAction(argparse.Action):
    """Append an engine spec; a later --patch / --base attaches to it."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = list(getattr(namespace, self.dest) or [])
        items.append(values)
        setattr(namespace, self.dest, items)


class _AttachAction(argparse.Action):
    """--patch / --base: attach to the latest engine of ``engines_dest``."""

    def __init__(self, option_strings, dest, engines_dest: str = "engine", many: bool = True, **kwargs):
        self.engines_dest, self.many = engines_dest, many
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        index = max(0, len(getattr(namespace, self.engines_dest) or []) - 1)
        table = dict(getattr(namespace, self.dest) or {})
        if self.many:
            table[index] = [*table.get(index, []), values]
        else:
            table[index] = values
        setattr(namespace, self.dest, table)


def add_engine_arguments(
    parser,
    *,
    dest: str = "engine",
    flag: str = "--engine",
    help: str,
    required: bool = False,
    group=None,
    metavar: str = "ENGINE",
) -> None:
    """``flag`` (repeatable; see the module docstring), ``--patch``, ``--base``."""
    target = group if group is not None else parser
    target.add_argument(
        flag, dest=dest, action=_EngineAction, default=None, required=required, metavar=metavar, help=help
    )
    parser.add_argument(
        "--patch",
        dest=f"{dest}_patches",
        action=_AttachAction,
        engines_dest=dest,
        default=None,
        metavar="FILE.diff",
        help=PATCH_HELP,
    )
    parser.add_argument(
        "--base",
        dest=f"{dest}_bases",
        action=_AttachAction,
        engines_dest=dest,
        many=False,
        default=None,
        metavar="vllm==X",
        help=BASE_HELP,
    )


@dataclass(frozen=True)
class EngineOption:
    """One ``--engine`` as the command line gave it, read once: ``spec``,
    its parsed name (None for a local build source, ``path:`` or
    ``wheel:``, which ``engine_adapter.host.builds`` reads), and the
    ``--patch`` / ``--base`` attached to it."""

    text: str
    spec: EngineSpec | None
    patches: tuple[str, ...] = ()
    base: str | None = None

    @property
    def family(self) -> Family:
        """The family it belongs to (a local build source: the default's)."""
        return FAMILIES[self.spec.family if self.spec is not None else DEFAULT_FAMILY]


def parse_engine_options(
    args, *, dest: str = "engine", flag: str = "--engine", default: str | None = None
) -> list[EngineOption]:
    """The engines the options give, each name parsed here, once (no
    build, no engine): bad names and misplaced ``--patch`` / ``--base`` are
    one line, before any work."""
    from ground.errors import invalid

    texts = list(getattr(args, dest, None) or ([] if default is None else [default]))
    patches = dict(getattr(args, f"{dest}_patches", None) or {})
    bases = dict(getattr(args, f"{dest}_bases", None) or {})
    if not texts and (patches or bases):
        raise invalid(
            "--patch" if patches else "--base",
            (patches or bases).get(0),
            f"needs {flag} vllm==X (or path:DIR / wheel:FILE.whl) to apply to",
        )
    out = []
    for i, text in enumerate(texts):
        local = isinstance(text, str) and text.strip().startswith(("path:", "wheel:"))  # builds.prepare reads those
        out.append(
            EngineOption(
                text,
                None if local else EngineSpec.parse(text, flag),
                tuple(map(str, patches.get(i) or ())),
                bases.get(i),
            )
        )
    return out


def engine_specs(
    args,
    *,
    dest: str = "engine",
    flag: str = "--engine",
    default: str | None = None,
    progress=None,
    parsed: list[EngineOption] | None = None,
) -> list[EngineSpec]:
    """The engines the options give (:class:`EngineSpec`, each name parsed
    once: :func:`parse_engine_options`, or ``parsed`` when the command read
    them already), each build built first. A ``--patch`` / ``--base`` with
    no engine to attach to applies to ``default``. A build made here is the
    name its build gives (read once), with the patches it is made of."""
    from dataclasses import replace

    from engine_adapter.host.builds import prepare

    options = parsed if parsed is not None else parse_engine_options(args, dest=dest, flag=flag, default=default)
    kwargs = {} if progress is None else {"progress": progress}
    out = []
    for option in options:
        source = option.spec if option.spec is not None else option.text
        name = prepare(source, list(option.patches) or None, option.base, flag=flag, **kwargs)
        out.append(
            option.spec
            if option.spec is not None and name == option.spec.name
            else replace(EngineSpec.parse(name), patches=option.patches)
        )
    return out


def has_build_options(args, dest: str = "engine") -> bool:
    return bool(getattr(args, f"{dest}_patches", None) or getattr(args, f"{dest}_bases", None))
