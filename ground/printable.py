"""Text from strangers made safe to print on a terminal or copy into a report.

A finding, a case, a live report or vLLM's own error message may hold
terminal control: an escape sequence that clears the screen (``ESC [2J``),
retitles the window or plants a hyperlink (OSC 8), a bidi override that
shows text in another order than it is (Trojan Source), a carriage return
that overwrites the line. kvspec prints such text, and copies it into the
reports it writes, only through :func:`printable`. It lives on the
ground floor (which everything may import), so the CLI and the report
writers share the one rule.
"""

from __future__ import annotations

import re

#: A whole escape sequence: CSI (``ESC [`` ... final byte), OSC / DCS / SOS /
#: PM / APC strings (to BEL, ST or the line's end), or a two-character ``ESC X``; also the
#: 8-bit CSI and OSC introducers.
_ESCAPE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
)
#: Bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069),
#: the implicit marks, and the Unicode line and paragraph separators.
_UNICODE = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f" + _UNICODE + "]")
#: Line-like controls: where they are not kept they become one space, so
#: words they separated stay apart.
_BREAKS = "\n\r\t\v\f\u2028\u2029"


def printable(text: object, *, keep: str = "") -> str:
    """``text`` (``str()`` of it) without terminal control: escape sequences
    removed whole, then every other C0/C1 control character, DEL, bidi
    embedding/override/isolate/mark and line/paragraph separator removed; a
    line break or tab (``\\n \\r \\t \\v \\f``, U+2028, U+2029) becomes one
    space. Characters in ``keep`` (only ``"\\n"`` and ``"\\t"`` may be kept)
    stay as they are."""
    if not set(keep) <= {"\n", "\t"}:
        raise ValueError(f"keep={keep!r}: only '\\n' and '\\t' may be kept")
    text = _ESCAPE.sub("", str(text))

    def one(m: re.Match) -> str:
        c = m.group()
        if c in keep:
            return c
        return " " if c in _BREAKS else ""

    return _CONTROL.sub(one, text)


def one_line(text: object, limit: int | None = None) -> str:
    """``text`` with every run of whitespace (line breaks included) made one
    space, cut to ``limit`` characters (ending ``...``) when given."""
    line = " ".join(str(text).split())
    return line if limit is None or len(line) <= limit else line[: limit - 3] + "..."


# ------------------------------------------------- per output: one rule each
#
# Every output kvspec writes a stranger's text into goes through one of
# these (docs/security.md lists them per output): the terminal through rich
# (:func:`rich_text`, never markup), a Markdown report or table
# (:func:`markdown_text`, :func:`markdown_cell`), an HTML table
# (:func:`html_text`). Each is :func:`printable` first.

#: Markdown punctuation that could open a link or an image (``[``, ``]``),
#: a code span (a backtick), or a table cell (``|``), and the backslash
#: itself: backslash-escaped (CommonMark lets any ASCII punctuation be);
#: ``&`` and ``<`` (raw HTML, an autolink, an entity) written as entities.
#: A line break is a space already, so nothing can start a heading, a list,
#: a quote or a fence.
_MARKDOWN_PUNCT = re.compile(r"([\\`\[\]|])")


def markdown_text(text: object) -> str:
    """``text`` as Markdown prose on one line: :func:`printable` (a line
    break becomes a space, so it can open no heading, list or fence), ``&``
    and ``<`` as entities (no raw HTML, no comment hiding the rest), and
    every character that could start a link (``[a](javascript:...)``), an
    image, a code span or a table cell backslash-escaped. For text inside
    a line (never at a line's start)."""
    flat = printable(text).replace("&", "&amp;").replace("<", "&lt;")
    return _MARKDOWN_PUNCT.sub(r"\\\1", flat)


def markdown_cell(text: object) -> str:
    """:func:`markdown_text` for a table cell (``|`` is escaped there too,
    so a cell cannot add a column; an empty text is ``-``)."""
    return markdown_text(text) or "-"


def html_text(text: object) -> str:
    """``text`` for an HTML element's body or a quoted attribute:
    :func:`printable`, then ``& < > " '`` as entities."""
    import html

    return html.escape(printable(text), quote=True)


def rich_text(text: object, style: str = ""):
    """``text`` as a :class:`rich.text.Text`: :func:`printable` and never
    read as rich markup (``[/]``, ``[link=...]`` stay literal text), for a
    table cell, a title or one ``console.print``. ``style`` is kvspec's own,
    never the stranger's."""
    from rich.text import Text

    return Text(printable(text), style=style)
