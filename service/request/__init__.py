"""Request state: one Sequence per request, its events, text stream, choices and errors; the strict JSON object hook."""
