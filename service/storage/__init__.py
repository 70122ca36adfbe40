"""The decision log in PostgreSQL: tables, migrations, the writer, the queries.

Plugged into the pipeline by the composition root; the core never imports it.
The public API is re-exported here (pinned by ``tests/storage``)::

    open_database / start_embedded / stop_embedded     where the database is
    upgrade / downgrade / head_revision                 Alembic, no alembic.ini
    make_engine / database_healthy                      engines, /readyz
    rows_from / outcome_row                             rows from contract objects
    DecisionLogWriter(engine).write(LogBatch) -> WriteResult
    count_requests / count_decisions / decisions_for / load_raw_request / logged_request
    joined_outcomes / pending_outcomes / count_dangling_outcomes / conflicts
    ensure_partitions / list_partitions

Every call that reaches the database raises `service.contract.errors.Unavailable`
when it cannot (see docs/storage.md).
"""

from service.storage.admin import (
    create_database,
    drop_database,
    open_database,
    url_with_database,
)
from service.storage.db_probe import database_healthy
from service.storage.embedded import (
    EmbeddedPostgres,
    running_pid,
    start_embedded,
    stop_embedded,
)
from service.storage.engine import make_engine, unavailable_on_failure
from service.storage.log.convert import (
    outcome_row,
    rows_from,
    unpack_probabilities,
    unpack_scores,
)
from service.storage.log.outcomes import (
    ConflictRecord,
    JoinedOutcome,
    PendingOutcome,
    conflicts,
    count_dangling_outcomes,
    count_joined_outcomes,
    joined_outcomes,
    pending_outcomes,
    rejoin_pending,
)
from service.storage.log.partitions import PartitionKeeper, ensure_partitions, list_partitions
from service.storage.log.rows import (
    Counts,
    DecisionRow,
    LogBatch,
    OutcomeCounts,
    OutcomeRow,
    PolicyRow,
    RequestRow,
    SnapshotRow,
    WriteResult,
)
from service.storage.log.writer import DecisionLogWriter
from service.storage.migrate import current_revision, downgrade, head_revision, upgrade
from service.storage.reads.log import (
    LoggedDecision,
    LoggedRequest,
    count_decisions,
    count_requests,
    decisions_for,
    load_raw_request,
    logged_request,
    reused_request_ids,
)
from service.storage.reads.summaries import PolicySummary, policy_summaries
from service.storage.stores.evaluation import EvaluationStore
from service.storage.stores.protocol import ProtocolStore

__all__ = [
    "ConflictRecord",
    "Counts",
    "DecisionLogWriter",
    "DecisionRow",
    "EmbeddedPostgres",
    "EvaluationStore",
    "JoinedOutcome",
    "LogBatch",
    "LoggedDecision",
    "LoggedRequest",
    "OutcomeCounts",
    "OutcomeRow",
    "PartitionKeeper",
    "PendingOutcome",
    "PolicyRow",
    "PolicySummary",
    "ProtocolStore",
    "RequestRow",
    "SnapshotRow",
    "WriteResult",
    "conflicts",
    "count_dangling_outcomes",
    "count_decisions",
    "count_joined_outcomes",
    "count_requests",
    "create_database",
    "current_revision",
    "database_healthy",
    "decisions_for",
    "downgrade",
    "drop_database",
    "ensure_partitions",
    "head_revision",
    "joined_outcomes",
    "list_partitions",
    "load_raw_request",
    "logged_request",
    "make_engine",
    "open_database",
    "outcome_row",
    "pending_outcomes",
    "policy_summaries",
    "rejoin_pending",
    "reused_request_ids",
    "rows_from",
    "running_pid",
    "start_embedded",
    "stop_embedded",
    "unavailable_on_failure",
    "unpack_probabilities",
    "unpack_scores",
    "upgrade",
    "url_with_database",
]
