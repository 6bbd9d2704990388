"""The OpenAI-compatible HTTP API: a thin translator over the same ``Intake`` as gRPC."""
