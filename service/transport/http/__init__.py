"""HTTP transport (FastAPI): the same contract and validation as gRPC, as JSON."""
