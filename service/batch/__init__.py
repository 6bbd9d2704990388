"""Durable batch jobs (inference.v1.BatchService): store, scheduler and gRPC translator."""
