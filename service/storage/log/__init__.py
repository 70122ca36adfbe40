"""The decision log: tables, partitions, payloads, the writer and the outcome join."""
