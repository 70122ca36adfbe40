"""The public API of service.storage, pinned: a change here is a deliberate one."""

from __future__ import annotations

import service.storage

PUBLIC = {
    "ConflictRecord",
    "Counts",
    "DecisionLogWriter",
    "EvaluationStore",
    "DecisionRow",
    "EmbeddedPostgres",
    "JoinedOutcome",
    "LogBatch",
    "LoggedDecision",
    "LoggedRequest",
    "OutcomeCounts",
    "OutcomeRow",
    "PartitionKeeper",
    "PendingOutcome",
    "PolicySummary",
    "ProtocolStore",
    "PolicyRow",
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
}


def test_exported_names_are_the_public_api() -> None:
    assert set(service.storage.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(service.storage, name) is not None


def test_storage_is_not_imported_by_the_core() -> None:
    # The reverse direction is checked by tests/test_architecture.py; here: no
    # transport or app imports from storage (it is plugged in, not plugging).
    import ast
    from pathlib import Path

    root = Path(service.storage.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(
                    (
                        "service.transport",
                        "service.server.app",
                        "service.pipeline",
                        "service.metrics",
                    )
                ), f"{path.name} imports {node.module}"
