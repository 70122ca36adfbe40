"""The anchor file: signed, ordered lines; a loose or missing key is refused."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine

from service.contract import MirrorRequest
from service.storage.chain.anchor import AnchorError, load_key, read_anchor
from service.storage.chain.seal import ChainSealer
from service.storage.chain.verify import verify
from tests.storage.chain.chain_helpers import DAY1, run_log, write_day


def test_a_new_key_is_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "k" / "chain.key"
    key = load_key(path)
    assert len(key) == 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_key(path) == key


def test_a_key_others_can_read_is_refused(db_url: str, chain_dir: Path, logged: Engine) -> None:
    path = chain_dir / "chain.key"
    load_key(path)
    os.chmod(path, 0o644)
    with pytest.raises(AnchorError, match="mode 644"):
        load_key(path)
    code, out = run_log(db_url, chain_dir, "seal")
    assert code == 2 and "chmod 600" in out


def test_verify_without_the_key_exits_2(db_url: str, chain_dir: Path, logged: Engine) -> None:
    code, out = run_log(db_url, chain_dir, "verify")
    assert code == 2 and "does not exist" in out


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@pytest.fixture()
def three_lines(
    logged: Engine, make_sealer: Callable[..., ChainSealer], requests_sample: list[MirrorRequest]
) -> ChainSealer:
    """An anchor with three seal lines."""
    sealer = make_sealer()
    sealer.seal_all()
    for i in range(2):
        write_day(logged, requests_sample[4], DAY1, 2, f"more{i}")
        sealer.seal_all()
    assert len(_lines(sealer.anchor.path)) == 3
    return sealer


def test_an_edited_anchor_line_fails(three_lines: ChainSealer, logged: Engine) -> None:
    path = three_lines.anchor.path
    lines = _lines(path)
    obj = json.loads(lines[1])
    obj["blocks"][0][4] = "0" * 64
    lines[1] = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    path.write_text("\n".join(lines) + "\n")

    report = verify(logged, [path], three_lines.anchor.key)

    assert report.first is not None and report.first.day is None
    assert "line 2: signature does not match" in report.first.what


def test_a_removed_anchor_line_fails(three_lines: ChainSealer, logged: Engine) -> None:
    path = three_lines.anchor.path
    lines = _lines(path)
    path.write_text("\n".join([lines[0], lines[2]]) + "\n")

    report = verify(logged, [path], three_lines.anchor.key)

    messages = [str(p) for p in report.problems]
    assert "a line was removed or reordered" in messages[0]
    assert any("sealed but not anchored" in m for m in messages)  # its blocks lost their anchor


def test_another_key_verifies_nothing(three_lines: ChainSealer, logged: Engine) -> None:
    contents = read_anchor(three_lines.anchor.path, b"\x01" * 32)
    assert len(contents.problems) == 3 and not contents.blocks


def test_blocks_sealed_but_not_anchored_are_anchored_by_the_next_seal(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    """A crash between a seal's commit and its anchor line loses no anchor."""
    sealer = make_sealer()
    sealer.seal_all()
    path = sealer.anchor.path
    path.write_text("")  # as if the anchor line never reached the disk,
    assert sealer.anchor.witness is not None
    sealer.anchor.witness.write_text("")  # nor its witness (written after the anchor)
    assert not verify(logged, [path], sealer.anchor.key).ok

    fresh = make_sealer()  # a restarted service
    fresh.seal()

    assert verify(logged, [path], fresh.anchor.key).ok
