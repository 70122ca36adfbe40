"""Checks an evidence package folder the way a reviewer's browser would see it."""

from __future__ import annotations

import json
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
        self._in_body = False

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

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_body = False


def check_package(folder: Path) -> dict[str, Any]:
    """Assert the package is complete; return its results.json."""
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
    text = index.read_text()
    assert "Known limitations and assumptions" in text
    results: dict[str, Any] = json.loads((folder / "results.json").read_text())
    assert results["limitations"] and results["assumptions"]
    report = (folder / "report.md").read_text()
    for src in page.images:
        assert f"]({src})" in report
    return results
