"""The decision log's lag in requests and seconds, next to its lag in records.

A batch of N mirrored requests is ONE journal record (issue 24), so
`understudy_db_lag_records` reads 1 where `understudy_db_lag_requests` must
read N (its accepted rows only) and `understudy_db_lag_seconds` the age of that
record. Against the real service (the client's real batches over gRPC, the
journal, the scorer held back by `scoring_enabled=False` or by a policy that
blocks until released) and against a real journal directly, with the tail cache
off so the records come from the segment files, and past one read chunk.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from service.client import MirrorClient
from service.contract import MirrorRequest
from service.pipeline import log_lag
from service.pipeline.batch_record import pack
from service.pipeline.journal import FsyncMode, IngestJournal, JournalConfig, RecordKind
from service.pipeline.log_lag import LogLag
from service.policies.baselines import LeastLoaded
from service.policies.registry import Registry
from service.server.app import Service
from service.wire.convert import mirror_request_to_pb
from tests.transport.test_decision_log_e2e import BlockingPolicy, wait_until

HANG_S = 60.0
NEVER = 3600.0


def gauges(service: Service) -> tuple[float | None, float | None, float | None]:
    """(records, requests, seconds) as a scrape reads them."""
    value = service.metrics.registry.get_sample_value
    return (
        value("understudy_db_lag_records"),
        value("understudy_db_lag_requests"),
        value("understudy_db_lag_seconds"),
    )


def mirror_batch(
    service: Service, token: str, sample: list[MirrorRequest], n: int, tag: str, bad: set[int]
) -> None:
    """Mirror `n` requests as ONE batch (the client's limit is `n`, and `n` stays under
    its 1 MiB bound); the `bad` ones are refused by index."""
    client = MirrorClient(
        f"127.0.0.1:{service.grpc_port}", token, max_batch_requests=n, linger_s=NEVER
    )
    try:
        for i in range(n):
            msg = mirror_request_to_pb(
                dataclasses.replace(sample[i % len(sample)], request_id=f"{tag}-{i}")
            )
            if i in bad:
                msg.state.cpu_free[0] = float("nan")
            assert client.mirror(msg)
        assert client.flush(HANG_S), client.stats()
        stats = client.close()
    finally:
        client.close(0.1)
    assert (stats.mirrors.accepted, stats.mirrors.rejected) == (n - len(bad), len(bad))
    assert stats.mirror_batches.batches_sent == 1, stats.mirror_batches


@pytest.mark.live
def test_a_batch_of_n_requests_is_one_record_and_n_requests_of_lag(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    service = make_service(scoring_enabled=False)  # nothing consumes the journal
    assert gauges(service) == (0.0, 0.0, 0.0)
    before = time.time()
    mirror_batch(service, runtime_token, requests_sample, 100, "a", bad=set())
    records, requests, age = gauges(service)
    assert (records, requests) == (1, 100)
    assert age is not None and 0.0 < age <= time.time() - before
    mirror_batch(service, runtime_token, requests_sample, 60, "b", bad={3, 30, 59})
    records, requests, age = gauges(service)
    assert (records, requests) == (2, 157), "a batch record counts its accepted rows only"
    assert age is not None and age <= time.time() - before


@pytest.mark.live
def test_the_lag_is_the_batch_while_the_scorer_holds_it_and_none_once_logged(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    blocking = BlockingPolicy()
    policies = Registry(
        policies={"blocking": blocking, "least-loaded": LeastLoaded()}, predictors={}
    )
    service = make_service(policies=policies)
    try:
        mirror_batch(service, runtime_token, requests_sample, 64, "h", bad=set())
        assert blocking.entered.wait(HANG_S), "the scorer never took the batch"
        records, requests, age = gauges(service)
        assert (records, requests) == (1, 64), "read by the scorer, not yet committed"
        assert age is not None and age > 0.0
    finally:
        blocking.release.set()
    wait_until(lambda: gauges(service)[0] == 0, HANG_S)
    assert gauges(service) == (0.0, 0.0, 0.0)


def test_the_lag_follows_the_checkpoint_over_records_read_from_the_segment_files(
    tmp_path: Path,
) -> None:
    config = JournalConfig(tmp_path, fsync_mode=FsyncMode.NEVER, tail_cache_bytes=0)
    n_single = log_lag.READ_CHUNK + 500  # more than one read, and enough to compact
    with IngestJournal(config) as journal:
        now = [0.0]
        lag = LogLag(journal, clock=lambda: now[0])
        assert (lag.requests(), lag.oldest_age_s()) == (0, 0.0)
        rows = np.arange(0, 40, 2)  # 20 accepted rows of a batch of 40
        batch = pack(RecordKind.OUTCOME_BATCH, rows, 40, b"")
        first = journal.append(RecordKind.OUTCOME_BATCH, batch)
        for i in range(n_single):
            journal.append(RecordKind.MIRROR, b"m%d" % i)
        last = journal.append(RecordKind.OUTCOME_BATCH, batch)
        assert first == 1 and last == n_single + 2
        stamped = {r.seq: r.appended_at for r in journal.read("scorer", 3)}
        now[0] = stamped[1] + 7.0
        assert lag.requests() == 20 + n_single + 20
        assert lag.oldest_age_s() == pytest.approx(7.0)
        journal.commit("scorer", 1)  # the batch record is logged
        assert lag.requests() == n_single + 20
        assert lag.oldest_age_s() == pytest.approx(now[0] - stamped[2])
        journal.commit("scorer", n_single)  # all but one single record and the last batch
        assert lag.requests() == 1 + 20
        journal.append(RecordKind.MIRROR, b"late")
        assert lag.requests() == 1 + 20 + 1, "new records are counted after a compaction"
        journal.commit("scorer", journal.head_seq)
        assert (lag.requests(), lag.oldest_age_s()) == (0, 0.0)
