"""gRPC transport: ShadowEvaluation servicer, health and reflection."""
