"""The ``--rule`` option of ``kvspec predict``, ``replay`` and ``run``: the
retention rule the reference model states (``reference.serial.RULES``),
declared once with what each rule means."""

from __future__ import annotations

from reference.serial import RULES

#: What each of :data:`reference.serial.RULES` is.
MEANING = "promise: kvspec's spec; replay/legacy: what vLLM 0.30-0.33 / <=0.29 implement"


def add_rule_argument(parser, *, what: str, auto: str | None = None) -> None:
    """``--rule``, one of the rules (default ``promise``); with ``auto``
    (what the command picks then) also ``auto``, its default."""
    default = "auto" if auto else "promise"
    parser.add_argument(
        "--rule",
        choices=("auto", *RULES) if auto else RULES,
        default=default,
        help=f"{what} (default: {auto or default}; {MEANING})",
    )
