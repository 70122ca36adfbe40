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
    if isinstance(c, Cell):
        title = f' title="{html.escape(c.note)}"' if c.note else ""
        return f'<td class="marked"{title}>{html.escape(c.text)}</td>'
    return f"<td>{html.escape(c)}</td>"


def html_table(head: Sequence[str], rows: Sequence[Sequence[TableCell]]) -> str:
    """An escaped HTML table with a ``thead`` and a ``tbody``."""
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"
