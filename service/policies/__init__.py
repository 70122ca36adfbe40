"""Candidate placement policies: the Policy interface, baselines, ONNX policies, registry."""
