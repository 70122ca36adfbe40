"""Slices of the decision log as Parquet and DSJSON."""
