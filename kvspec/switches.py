"""On/off switches of the commands' parsers, declared from a table.

A command's run of ``store_true`` flags is a mapping of flag to help text;
:func:`add_switches` declares them in that order, the order ``--help``
lists them in.
"""

from __future__ import annotations


def add_switches(parser, helps: dict[str, str]) -> None:
    """Declare each flag of ``helps`` as a switch (``action="store_true"``,
    default False) with its help text, in the mapping's order."""
    for flag, text in helps.items():
        parser.add_argument(flag, action="store_true", help=text)
