"""Transports: convert messages, delegate to the pipeline, map errors. Nothing else."""
