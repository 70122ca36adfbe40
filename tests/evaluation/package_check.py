"""Checks an evidence package folder the way a reviewer's browser would see it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any


class _Page(HTMLParser):
    """Collects image sources, links and each table's body row count."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.table_rows: list[int] = []
        self.headings: list[str] = []
        self._in_body = False
        self._heading: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "img":
            self.images.append(values.get("src") or "")
        elif tag in ("a", "link", "script") and (values.get("href") or values.get("src")):
            self.links.append(values.get("href") or values.get("src") or "")
        elif tag == "table":
            self.table_rows.append(0)
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.table_rows[-1] += 1
        elif tag in ("h1", "h2", "h3"):
            self._heading = []

    def handle_data(self, data: str) -> None:
        if self._heading is not None:
            self._heading.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_body = False
        elif tag in ("h1", "h2", "h3") and self._heading is not None:
            self.headings.append("".join(self._heading).strip())
            self._heading = None


def check_package(folder: Path, sections: Iterable[str] = ()) -> dict[str, Any]:
    """Assert the package is complete; return its results.json.

    `sections` are headings the page must show (e.g. "Failure modes"), each also
    a key of ``results.json["sections"]`` when given as ``(heading, key)`` pairs
    by `check_sections`.
    """
    index = folder / "index.html"
    assert index.is_file() and (folder / "report.md").is_file()
    page = _Page()
    page.feed(index.read_text())
    page.close()
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
