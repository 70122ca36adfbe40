"""Live statistical checks: drift, outcome drift, calibration.

Pure like the rest of the core: arrays in, verdicts out; the evaluator loop
runs them on what storage reads.
"""
