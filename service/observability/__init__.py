"""Telemetry (OpenTelemetry traces and metrics), engine metrics and the GetMetrics view."""
