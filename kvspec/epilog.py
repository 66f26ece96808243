"""The text a command's ``--help`` shows after its options."""

from __future__ import annotations

import argparse


def set_epilog(parser: argparse.ArgumentParser, text: str) -> None:
    """Show ``text`` after the options with its line breaks kept (argparse
    would refill it): the epilog and ``RawDescriptionHelpFormatter``."""
    parser.epilog = text
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
