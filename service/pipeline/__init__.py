"""The running engine: ingest journal, batching scorer, log writer, evaluator loop."""
