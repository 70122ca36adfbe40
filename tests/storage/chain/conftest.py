"""Tamper-evidence fixtures: a migrated database with two days of real decisions, a sealer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from service.contract import MirrorRequest
from service.storage import make_engine
from service.storage.chain.anchor import Anchor, load_key
from service.storage.chain.seal import ChainSealer
from tests.storage.chain.chain_helpers import DAY1, DAY2, witness_file, write_day


@pytest.fixture()
def engine(db_url: str) -> Iterator[Engine]:
    """An engine on the test's own migrated database."""
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture()
def chain_dir(tmp_path: Path) -> Path:
    """Where the key and the anchor live: outside the database, as in production."""
    return tmp_path / "chain"


@pytest.fixture()
def make_sealer(engine: Engine, chain_dir: Path) -> Callable[..., ChainSealer]:
    """Factory: a sealer on the test's anchor (small blocks, so a day has several)."""

    def make(block_rows: int = 16, max_rows: int = 50_000) -> ChainSealer:
        key = load_key(chain_dir / "chain.key")
        anchor = Anchor(chain_dir / "chain-anchor.jsonl", key, witness_file(chain_dir))
        return ChainSealer(engine, anchor, block_rows=block_rows, max_rows=max_rows)

    return make


@pytest.fixture()
def logged(engine: Engine, requests_sample: list[MirrorRequest]) -> Engine:
    """Two days of requests and two policies' decisions, written by the real writer."""
    write_day(engine, requests_sample[0], DAY1, 40, "a")
    write_day(engine, requests_sample[1], DAY2, 30, "b")
    return engine
