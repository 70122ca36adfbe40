"""Benchmarks, reported as ratios against raw limits measured in the same run."""
