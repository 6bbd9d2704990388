"""Python client library for inference.v1.InferenceService."""
