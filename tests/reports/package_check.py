"""Checks an evidence package folder the way a reviewer's browser would see it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any


@dataclass
class Table:
    """One table of the page: the ``h2`` it sits under, its head and body cells."""

    section: str
    head: list[str] = field(default_factory=list)
    rows: list[list[tuple[str, str]]] = field(default_factory=list)
    """Per body row, ``(text, class attribute)`` per cell."""


class _Page(HTMLParser):
    """Collects image sources, links, each table's body row count, and every table's
    cells under the ``h2`` it follows."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.table_rows: list[int] = []
        self.headings: list[str] = []
        self.h2: list[str] = []
        self.tables: list[Table] = []
        self.items: dict[str, list[str]] = {}
        """Text of each ``<li>`` under each ``h2`` (``""``: before the first)."""
        self._in_body = False
        self._heading: list[str] | None = None
        self._cell: list[str] | None = None
        self._cell_class = ""
        self._item: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag in ("td", "th"):
            self._cell, self._cell_class = [], values.get("class") or ""
        elif tag == "li":
            self._item = []
        if tag == "img":
            self.images.append(values.get("src") or "")
        elif tag in ("a", "link", "script") and (values.get("href") or values.get("src")):
            self.links.append(values.get("href") or values.get("src") or "")
        elif tag == "table":
            self.table_rows.append(0)
            self.tables.append(Table(self.h2[-1] if self.h2 else ""))
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.table_rows[-1] += 1
            self.tables[-1].rows.append([])
        elif tag in ("h1", "h2", "h3"):
            self._heading = []

    def handle_data(self, data: str) -> None:
        for buffer in (self._heading, self._cell, self._item):
            if buffer is not None:
                buffer.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_body = False
        elif tag in ("td", "th") and self._cell is not None:
            text = "".join(self._cell).strip()
            if tag == "th":
                self.tables[-1].head.append(text)
            else:
                self.tables[-1].rows[-1].append((text, self._cell_class))
            self._cell = None
        elif tag == "li" and self._item is not None:
            self.items.setdefault(self.h2[-1] if self.h2 else "", []).append(
                "".join(self._item).strip()
            )
            self._item = None
        elif tag in ("h1", "h2", "h3") and self._heading is not None:
            self.headings.append("".join(self._heading).strip())
            if tag == "h2":
                self.h2.append(self.headings[-1])
            self._heading = None


def parse_page(index: Path) -> _Page:
    """The page at `index`, parsed."""
    page = _Page()
    page.feed(index.read_text())
    page.close()
    return page


DECISION_SUMMARY = "Decision summary"


def check_decision_summary(folder: Path, results: dict[str, Any]) -> Table:
    """The page opens with the decision summary: its first ``h2``, holding a table with
    one row per policy of results.json (in order) and the estimates plot; returns that
    table."""
    page = parse_page(folder / "index.html")
    assert page.h2 and page.h2[0] == DECISION_SUMMARY, page.h2[:3]
    assert page.images and page.images[0] == "figures/estimates.png", page.images[:2]
    table = page.tables[0]
    if not results["policies"]:
        assert table.section != DECISION_SUMMARY
        return Table(DECISION_SUMMARY)
    assert table.section == DECISION_SUMMARY, table.section
    labels = [f"{p['policy']}@{p['version']}" for p in results["policies"]]
    assert [row[0][0] for row in table.rows] == labels
    assert {"policy", "verdict", "marks"} <= set(table.head), table.head
    assert any(h.endswith(" value") for h in table.head), table.head
    return table


def check_package(folder: Path, sections: Iterable[str] = ()) -> dict[str, Any]:
    """Assert the package is complete; return its results.json.

    `sections` are headings the page must show (e.g. "Failure modes"), each also
    a key of ``results.json["sections"]`` when given as ``(heading, key)`` pairs
    by `check_sections`.
    """
    index = folder / "index.html"
    assert index.is_file() and (folder / "report.md").is_file()
    page = parse_page(index)
    assert page.images, "the page shows no figures"
    for src in page.images:
        assert not src.startswith(("http:", "https:", "//")), src
        path = folder / src
        assert path.is_file(), f"referenced image {src} is missing"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{src} is not a PNG"
    assert not page.links, f"the page refers to outside resources: {page.links}"
    assert page.table_rows and all(n > 0 for n in page.table_rows), page.table_rows
    for heading in ("Known limitations and assumptions", *sections):
        assert heading in page.headings, f"no heading {heading!r} in {page.headings}"
    results: dict[str, Any] = json.loads((folder / "results.json").read_text())
    assert results["limitations"] and results["assumptions"]
    report = (folder / "report.md").read_text()
    for src in page.images:
        assert f"]({src})" in report
    figures = set(results["figures"])
    shown = {src.removeprefix("figures/") for src in page.images}
    assert figures == shown, f"figures listed but not shown: {figures ^ shown}"
    check_decision_summary(folder, results)
    return results


def check_sections(results: dict[str, Any], keys: Iterable[str]) -> None:
    """Every key has a section in results.json, and every number in it carries provenance."""
    for key in keys:
        assert key in results["sections"], f"no section {key!r} in {sorted(results['sections'])}"
        _provenance_everywhere(results["sections"][key], key)


def _provenance_everywhere(node: Any, where: str, tagged: bool = False) -> None:
    """A dict holding a number under a value-like key carries ``provenance``, or sits
    inside one that does."""
    if isinstance(node, dict):
        tagged = tagged or "provenance" in node
        numbers = {"value", "mean", "lower", "upper", "share", "score"} & set(node)
        if numbers and any(isinstance(node[k], int | float) for k in numbers):
            assert tagged, f"{where}: {sorted(node)} has no provenance"
        for k, v in node.items():
            _provenance_everywhere(v, f"{where}.{k}", tagged)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _provenance_everywhere(v, f"{where}[{i}]", tagged)
