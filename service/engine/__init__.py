"""The engine loop's parts: one model step, per-token bookkeeping, the speculator and the watchdog."""
