"""Reviewer reads run as the reviewer's database role, and every one is written to the access log.

`ReviewerAccess` is what the reviewer API calls. Each read is one transaction:

1. ``SET LOCAL ROLE understudy_reviewer`` (migration 0004): the read runs with
   SELECT-only privileges, so even a statement that went wrong could not write;
   ``statement_timeout`` bounds what one query may cost;
2. the read (`service.storage.reviewer.reads`, `service.storage.reviewer.request`);
3. ``RESET ROLE``, then one ``reviewer_access_log`` row: principal, role,
   endpoint, parameters, rows returned, outcome;
4. commit. A result is only returned once its access-log row is committed.

Queries refused before any SQL (a bad filter: `InvalidInput`) or for the
caller's role are logged too, in their own transaction and best effort: the
refusal itself must reach the caller even while the database is down. So are
reads that fail: the database unreachable (``error``), past the statement
timeout (``timeout``, raised as `ReviewerTimeout`), or any unexpected error
(``failed``, which the API answers with a 500) — every query, failed or not,
has its row. Each row carries the HTTP status the API answers for its outcome
(`STATUS_OF`). Parameters are logged as sent, made storable (NUL escaped,
long values cut).

The reviewer cannot reconfigure these reads: they run on the service's own
connection, and the statement timeout is set per transaction (``SET LOCAL``)
after the role switch, from a value only the service holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import psycopg
from sqlalchemy import Connection, Engine, exc, insert, text

from service.contract import DEFAULT_FEATURES, FeatureFunction
from service.contract.errors import InvalidInput, NotFound, Unavailable
from service.protocols import ProtocolEvent
from service.storage.engine import unavailable_on_failure
from service.storage.reviewer.query import (
    check_text,
    encode_cursor,
    parse_decision_query,
    parse_int,
)
from service.storage.reviewer.reads import (
    DecisionPage,
    ExperimentItem,
    decision_page,
    events,
    experiments,
)
from service.storage.reviewer.request import RequestInFull, request_in_full
from service.storage.reviewer.tables import REVIEWER_ROLE, reviewer_access_log

log = logging.getLogger(__name__)

T = TypeVar("T")

STATEMENT_TIMEOUT_MS = 30_000
MAX_LOGGED_VALUE = 512
MAX_LOGGED_PARAMETERS = 32
MAX_ID = 512

STATUS_OF: dict[str, int] = {
    "ok": 200,
    "rejected": 400,
    "denied": 403,
    "not_found": 404,
    "failed": 500,
    "error": 503,
    "timeout": 503,
}
"""The HTTP status the reviewer API answers for each logged outcome."""


class ReviewerTimeout(Unavailable):
    """A reviewer read ran past its statement timeout (logged as ``timeout``)."""


def _timed_out(err: BaseException | None) -> bool:
    return isinstance(err, exc.DBAPIError) and isinstance(err.orig, psycopg.errors.QueryCanceled)


@dataclass(frozen=True, slots=True)
class Reviewer:
    """Who asks: the principal and role their token resolved to."""

    principal: str
    role: str


@dataclass(frozen=True, slots=True)
class Page:
    """A page of decisions and the cursor that continues it (None at the end)."""

    page: DecisionPage
    next_cursor: str | None


def _storable(value: str, limit: int) -> str:
    """`value` as PostgreSQL text/jsonb can hold it: no NUL, no lone surrogate, bounded."""
    clean = value.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\\u0000")
    return clean if len(clean) <= limit else f"{clean[:limit]}...[{len(clean)} chars]"


def loggable(params: Mapping[str, str]) -> dict[str, str]:
    """The parameters as they will be stored in the access log."""
    items = list(params.items())[:MAX_LOGGED_PARAMETERS]
    return {_storable(k, 64): _storable(v, MAX_LOGGED_VALUE) for k, v in items}


class ReviewerAccess:
    """The reviewer's reads over `engine`, audited (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        features: FeatureFunction = DEFAULT_FEATURES,
        statement_timeout_ms: int = STATEMENT_TIMEOUT_MS,
    ) -> None:
        self.engine = engine
        self.features = features
        self.statement_timeout_ms = statement_timeout_ms

    def _write(
        self,
        conn: Connection,
        who: Reviewer,
        endpoint: str,
        params: Mapping[str, str],
        rows: int,
        outcome: str,
        detail: str | None,
    ) -> None:
        conn.execute(
            insert(reviewer_access_log).values(
                principal=_storable(who.principal, MAX_LOGGED_VALUE),
                role=who.role,
                endpoint=endpoint,
                parameters=loggable(params),
                rows_returned=rows,
                outcome=outcome,
                detail=None if detail is None else _storable(detail, 1000),
                status=STATUS_OF[outcome],
            )
        )

    def record_refusal(
        self, who: Reviewer, endpoint: str, params: Mapping[str, str], outcome: str, why: str
    ) -> None:
        """Log a query refused or failed outside a read's transaction; best effort."""
        try:
            with unavailable_on_failure("logging reviewer access"), self.engine.begin() as conn:
                self._write(conn, who, endpoint, params, 0, outcome, why)
        except Unavailable as err:
            log.warning("reviewer access log not written (%s %s): %s", outcome, endpoint, err)

    def _audited(
        self,
        who: Reviewer,
        endpoint: str,
        params: Mapping[str, str],
        read: Callable[[Connection], T],
        count: Callable[[T], int],
    ) -> T:
        refused: NotFound | None = None
        try:
            with unavailable_on_failure("reading for a reviewer"), self.engine.begin() as conn:
                conn.execute(text(f"SET LOCAL ROLE {REVIEWER_ROLE}"))  # a constant
                conn.execute(
                    text("SELECT set_config('statement_timeout', :ms, true)"),
                    {"ms": str(self.statement_timeout_ms)},
                )
                try:
                    result = read(conn)
                except NotFound as exc:
                    refused = exc
                conn.execute(text("RESET ROLE"))
                if refused is None:
                    self._write(conn, who, endpoint, params, count(result), "ok", None)
                else:
                    self._write(conn, who, endpoint, params, 0, "not_found", str(refused))
        except Unavailable as err:
            if _timed_out(err.__cause__):
                why = (
                    f"the query ran past its {self.statement_timeout_ms} ms statement "
                    "timeout; narrow the filters or lower `limit`"
                )
                self.record_refusal(who, endpoint, params, "timeout", why)
                raise ReviewerTimeout(why) from err.__cause__
            self.record_refusal(who, endpoint, params, "error", str(err))
            raise
        except Exception as err:  # a 500: still the caller's query, so still logged
            self.record_refusal(who, endpoint, params, "failed", f"{type(err).__name__}: {err}")
            raise
        if refused is not None:
            raise refused
        return result

    def decisions(self, who: Reviewer, params: Mapping[str, str]) -> Page:
        """A page of decisions filtered by `params` (see `parse_decision_query`).

        Raises:
            InvalidInput: a parameter is wrong (logged as ``rejected``).
            NotFound: the ``experiment`` is not recorded.
        """
        try:
            query = parse_decision_query(params)
        except InvalidInput as exc:
            self.record_refusal(who, "decisions", params, "rejected", str(exc))
            raise
        page = self._audited(
            who,
            "decisions",
            params,
            lambda conn: decision_page(conn, query),
            lambda p: len(p.items),
        )
        key = page.next_cursor_key
        digest = query.filter.digest(query.order)
        return Page(page, None if key is None else encode_cursor(key, query.order, digest))

    def request(self, who: Reviewer, request_id: str, endpoint: str = "request") -> RequestInFull:
        """One request in full; `NotFound` if it is not logged. `endpoint`: as access-logged
        (``request_feasibility`` when only its options' masks are shown)."""
        params = {"request_id": request_id}
        try:
            check_text("request_id", request_id, MAX_ID)
        except InvalidInput as exc:
            self.record_refusal(who, endpoint, params, "rejected", str(exc))
            raise
        return self._audited(
            who,
            endpoint,
            params,
            lambda conn: request_in_full(conn, request_id, self.features),
            lambda _: 1,
        )

    def experiments(self, who: Reviewer, protocol_id: str | None = None) -> list[ExperimentItem]:
        """Recorded protocol versions, optionally of one protocol."""
        params = {} if protocol_id is None else {"protocol_id": protocol_id}
        try:
            if protocol_id is not None:
                check_text("protocol_id", protocol_id)
        except InvalidInput as exc:
            self.record_refusal(who, "experiments", params, "rejected", str(exc))
            raise
        return self._audited(
            who, "experiments", params, lambda conn: experiments(conn, protocol_id), len
        )

    def events(self, who: Reviewer, protocol_id: str, version: str) -> list[ProtocolEvent]:
        """Every event of a protocol version; `NotFound` if it is not recorded."""
        params = {"protocol_id": protocol_id, "version": version}
        try:
            check_text("protocol_id", protocol_id)
            number = parse_int("version", version, 1, 2**31 - 1)
        except InvalidInput as exc:
            self.record_refusal(who, "events", params, "rejected", str(exc))
            raise
        return self._audited(
            who, "events", params, lambda conn: events(conn, protocol_id, number), len
        )
