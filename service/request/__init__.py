"""Request state: one Sequence per request, its events, text stream, choices and errors."""
