"""The KV-event publisher's settings (``service.assembly`` fills them from the server's flags)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVEventsConfig:
    """Where and how the prefix index's changes are published (vLLM's ``KVEventsConfig`` fields).

    ``endpoint``: the PUB socket (bound when it has ``*``, ``::``, or is ``ipc://``/``inproc://``,
    else connected, as vLLM decides); ``topic``: the first frame of every message;
    ``replay_endpoint``: a ROUTER socket answering "batches since seq N" (empty: none);
    ``buffer_steps``: batches kept for replay; ``hwm``: the PUB socket's send high-water mark;
    ``max_queue``: batches waiting for the publisher thread before the engine drops one.
    """

    endpoint: str
    topic: str = ""
    replay_endpoint: str = ""
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue: int = 100_000
