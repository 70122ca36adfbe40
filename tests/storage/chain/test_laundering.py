"""A tamper cannot be laundered by `log seal`: it refuses to sign what the signed heads deny.

The attacker of issue 20 item 4 has the service's database role and write
access to the anchor file, not the key and not the witness: edit a sealed
decision, rewrite the chain blocks from there, cut the anchor before the
line that signed that block, run ``understudy log seal``. Before the witness
and the seal-time check the seal signed the forged heads and `verify` passed.

Only the CLI, the database and the files are used (as the attacker and the
operator would), so these tests also run against the code before the fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine

from service.contract import MirrorRequest
from service.storage.chain.seal import ChainSealer
from tests.storage.chain.chain_helpers import (
    DAY1,
    position_of,
    rewrite_chain,
    run_log,
    sql,
    write_day,
)

BLOCK = 16


def _witness(chain_dir: Path) -> Path:
    """Where `run_log` points ``UNDERSTUDY_CHAIN_WITNESS_FILE`` (another directory)."""
    return chain_dir.parent / "witness" / "chain-anchor.jsonl"


def _two_seals(logged: Engine, db_url: str, chain_dir: Path, base: MirrorRequest) -> None:
    """Two seal lines: the second signs day 1's blocks of the `late-*` requests."""
    assert run_log(db_url, chain_dir, "seal")[0] == 0
    write_day(logged, base, DAY1, 20, "late", first=100)
    assert run_log(db_url, chain_dir, "seal")[0] == 0


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_the_laundering_sequence_is_refused_and_verify_names_the_cut(
    logged: Engine, db_url: str, chain_dir: Path, requests_sample: list[MirrorRequest]
) -> None:
    _two_seals(logged, db_url, chain_dir, requests_sample[4])
    anchor = chain_dir / "chain-anchor.jsonl"
    signed = _lines(anchor)
    assert len(signed) == 2
    victim = position_of(logged, DAY1, "late-105", "p1")
    block = victim // BLOCK
    assert [DAY1.isoformat(), block] in [b[:2] for b in json.loads(signed[1])["blocks"]]

    # The attacker: edit the sealed decision, rewrite the chain from there, cut line 2.
    sql(
        logged,
        "UPDATE decisions SET chosen_probability = 0.99 WHERE request_id = 'late-105' "
        "AND policy_name = 'p1'",
    )
    rewrite_chain(logged, DAY1)
    anchor.write_text(signed[0] + "\n")

    code, out = run_log(db_url, chain_dir, "seal")

    print(f"seal after the laundering attempt: exit {code}: {out}")
    assert code == 1, out
    assert "refusing to sign" in out
    assert (
        f"lacks line 2 that its witness {_witness(chain_dir)} holds: the anchor file was cut" in out
    ), out
    assert _lines(anchor) == signed[:1]  # nothing was signed

    code, out = run_log(db_url, chain_dir, "verify")

    print(f"verify after the laundering attempt: exit {code}: {out}")
    assert code == 1
    assert "first broken link: anchor: anchor chain-anchor.jsonl lacks line 2 that" in out
    assert (
        f"day {DAY1}, block {block}, position {block * BLOCK} (request `" in out
        and "the anchor signed" in out
        and "(line 2)" in out
    ), out


def test_a_rewritten_chain_is_not_extended(
    logged: Engine, db_url: str, chain_dir: Path, requests_sample: list[MirrorRequest]
) -> None:
    """Without cutting any file: the next seal would chain new rows onto a forged tail."""
    _two_seals(logged, db_url, chain_dir, requests_sample[4])
    sql(
        logged,
        "UPDATE decisions SET latency_us = 1 WHERE request_id = 'late-119' AND policy_name = 'p2'",
    )
    rewrite_chain(logged, DAY1)
    write_day(logged, requests_sample[5], DAY1, 3, "later", first=200)
    lines = _lines(chain_dir / "chain-anchor.jsonl")

    code, out = run_log(db_url, chain_dir, "seal")

    assert code == 1, out
    assert f"refusing to seal: decision_chain_blocks day {DAY1} block" in out
    assert "the chain table was rewritten" in out
    assert _lines(chain_dir / "chain-anchor.jsonl") == lines


def test_a_running_sealer_checks_the_tail_it_extends(
    logged: Engine, make_sealer: Callable[..., ChainSealer], requests_sample: list[MirrorRequest]
) -> None:
    """The service's sealer (no catch-up after its first seal) compares each day's tail."""
    from service.storage.chain.anchor import SealRefused

    sealer = make_sealer()
    sealer.seal_all()
    sql(logged, "UPDATE decisions SET latency_us = 1 WHERE request_id = 'a-39'")
    rewrite_chain(logged, DAY1)
    write_day(logged, requests_sample[5], DAY1, 3, "later", first=200)
    lines = _lines(sealer.anchor.path)

    with pytest.raises(SealRefused, match=f"decision_chain_blocks day {DAY1} ends with block"):
        sealer.seal()

    assert _lines(sealer.anchor.path) == lines


def test_an_unanchored_block_is_verified_before_it_is_anchored(
    logged: Engine, db_url: str, chain_dir: Path, requests_sample: list[MirrorRequest]
) -> None:
    """Both files cut back (as after a crash) and a row edited: catch-up recomputes, refuses."""
    _two_seals(logged, db_url, chain_dir, requests_sample[4])
    anchor, witness = chain_dir / "chain-anchor.jsonl", _witness(chain_dir)
    first = _lines(anchor)[0] + "\n"
    anchor.write_text(first)
    witness.write_text(first)
    sql(logged, "UPDATE decisions SET error = 'x' WHERE request_id = 'late-110'")

    code, out = run_log(db_url, chain_dir, "seal")

    assert code == 1, out
    assert "refusing to seal: unanchored decision_chain_blocks day" in out
    assert "a row or the block was edited" in out
    assert _lines(anchor) == [first.strip()]


def test_a_witness_behind_its_anchor_is_completed(
    logged: Engine,
    make_sealer: Callable[..., ChainSealer],
    requests_sample: list[MirrorRequest],
    chain_dir: Path,
) -> None:
    """A crash between the anchor's write and the witness's: the next seal copies the line."""
    sealer = make_sealer()
    sealer.seal_all()
    witness = _witness(chain_dir)
    witness.write_text("")  # the line reached the anchor only
    write_day(logged, requests_sample[4], DAY1, 2, "more", first=300)

    make_sealer().seal_all()  # a restarted service

    assert witness.read_text() == sealer.anchor.path.read_text()
    assert len(_lines(witness)) == 2
