"""`log verify` numbers anchor lines from 1 in every message, as an editor does (issue 20 item 9).

It used to say "line 2" for the second line when a signature broke but
"anchor line 0" for the first line that signed a broken block.
"""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import Engine

from service.contract import MirrorRequest
from tests.storage.chain.chain_helpers import DAY1, DAY2, rewrite_chain, run_log, sql, write_day


def test_every_message_numbers_anchor_lines_from_one(
    logged: Engine, db_url: str, chain_dir: Path, requests_sample: list[MirrorRequest]
) -> None:
    assert run_log(db_url, chain_dir, "seal")[0] == 0  # line 1: days 1 and 2
    write_day(logged, requests_sample[4], DAY1, 2, "more", first=100)
    assert run_log(db_url, chain_dir, "seal")[0] == 0  # line 2
    anchor = chain_dir / "chain-anchor.jsonl"
    lines = anchor.read_text().splitlines()
    assert len(lines) == 2

    sql(logged, "UPDATE decisions SET latency_us = 7 WHERE request_id = 'b-3'")  # signed on line 1
    sql(logged, "UPDATE decisions SET latency_us = 7 WHERE request_id = 'a-39'")
    rewrite_chain(logged, DAY1)  # so this one is named by block, "the anchor signed ... (line N)"
    code, out = run_log(db_url, chain_dir, "verify")

    assert code == 1
    assert "(anchor line 1)" in out, out  # DAY2's row, exactly named
    assert "(line 1): a row among positions" in out, out  # DAY1's block
    assert "line 0" not in out, out

    edited = json.loads(lines[1])
    edited["watermark"] += 1
    anchor.write_text(lines[0] + "\n" + json.dumps(edited) + "\n")
    code, out = run_log(db_url, chain_dir, "verify", "--witness", str(chain_dir / "none.jsonl"))
    assert code == 1
    assert "anchor chain-anchor.jsonl line 2: signature does not match" in out, out
    assert f"day {DAY2}" in out
