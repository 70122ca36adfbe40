"""Tables shared by both evidence packages (protocol evidence and OPE evidence).

A cell is a string, or a `Cell` when it must not be read as a plain number:
HTML greys it (class ``marked``) and carries the reason as a tooltip, so a
reviewer scanning a column sees at once which numbers to distrust; Markdown
has no styling, so the text itself must say it (the OPE tables put marked
values in parentheses and give the reason in a ``marks`` column).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

MARKED_STYLE = "td.marked{color:#888;background:#f4f4f4;font-style:italic}"
"""The CSS rule a page using marked cells must include."""
TABLE_STYLE = "td{white-space:nowrap}td.wrap{white-space:normal;min-width:9em}" + MARKED_STYLE
"""Numbers, intervals and labels stay on one line (an interval broken after its comma
reads as two numbers); long text (verdicts, notes) wraps."""
WRAP_AT = 28
"""Cells longer than this many characters may wrap (class ``wrap``)."""


@dataclass(frozen=True, slots=True)
class Cell:
    """A table cell shown as not-a-plain-number; `note` says why (the tooltip)."""

    text: str
    note: str = ""


TableCell = str | Cell


def _text(c: TableCell) -> str:
    return c.text if isinstance(c, Cell) else c


def md_table(head: Sequence[str], rows: Sequence[Sequence[TableCell]]) -> list[str]:
    """A GitHub-flavoured Markdown table, ``|`` escaped and newlines flattened."""

    def cell(c: TableCell) -> str:
        return _text(c).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def _td(c: TableCell) -> str:
    text = _text(c)
    classes = (["marked"] if isinstance(c, Cell) else []) + (
        ["wrap"] if len(text) > WRAP_AT else []
    )
    attrs = f' class="{" ".join(classes)}"' if classes else ""
    if isinstance(c, Cell) and c.note:
        attrs += f' title="{html.escape(c.note)}"'
    return f"<td{attrs}>{html.escape(text)}</td>"


def html_table(head: Sequence[str], rows: Sequence[Sequence[TableCell]]) -> str:
    """An escaped HTML table with a ``thead`` and a ``tbody``."""
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"
