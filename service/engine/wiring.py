"""What an engine is built from: its settings (``EngineConfig``) and collaborators (``Collaborators``).

``service.assembly`` fills both from ``ServerConfig`` and ``service.server``
supplies the collaborators (telemetry hooks, grammar masks, thread control,
failure callback, event loop); the ``Engine`` is complete when its constructor
returns. Each collaborator is a Protocol or a callback, never the owner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from service.engine.model_step import MaskFiller, RequestHooks
from service.engine.speculator import SpecConfig
from service.observability.engine_metrics import EngineMetrics
from service.request.sequence import Sequence


class ThreadControl(Protocol):
    """Adjusts the decode's thread count between steps (``service.threads.adaptive.AdaptiveThreads``)."""

    def after_step(self, n_tokens: int, seconds: float, running: Iterable[Sequence] = ()) -> None:
        """One finished step of ``n_tokens`` took ``seconds``; may change threads before the next."""
        ...


@dataclass(frozen=True)
class EngineConfig:
    """The engine's limits: running batch, step tokens, queues, watchdog, speculation, batch-row cap."""

    max_running: int = 16
    step_tokens: int = 128
    batch_prefill_budget: int = 64
    queue_limits: tuple[int, int] = (256, 1024)  # interactive, batch
    step_timeout_s: float = 60.0  # a step longer than this fails the engine (0 = no watchdog)
    speculation: SpecConfig = field(default_factory=SpecConfig)
    batch_rows_with_interactive: int = 0  # batch decode rows beside interactive work (0: no cap)
    long_prompt_tokens: int = 0  # prompts with more tokens left go after shorter ones (0: arrival order)


@dataclass(frozen=True)
class Collaborators:
    """What the engine calls out to, handed to its constructor (every one optional).

    ``metrics``: where it counts (a fresh ``EngineMetrics`` if None; pass one to share it, e.g.
    with the grammar service); ``hooks``: per-request tracing (no-op ``Telemetry`` if None);
    ``mask_batch``: grammar masks for constrained rows (None: no constrained requests);
    ``thread_control``: adapts the decode's threads after each step; ``on_failure(cause)``: runs
    once on ``loop`` when the engine fails; ``loop``: where events are delivered (None: on the
    engine thread itself, for tests and tools).
    """

    metrics: EngineMetrics | None = None
    hooks: RequestHooks | None = None
    mask_batch: MaskFiller | None = None
    thread_control: ThreadControl | None = None
    on_failure: Callable[[str], None] | None = None
    loop: asyncio.AbstractEventLoop | None = None

__all__ = ["Collaborators", "EngineConfig", "ThreadControl"]
