"""The engine's inbox: typed messages, in order, drained until empty (no model)."""

from __future__ import annotations

import time

from service.engine.inbox import Abort, CancelAll, Inbox, Message, Pause, Submit, Wake
from service.request.events import Error
from service.request.sequence import SamplingParams, Sequence


def seq(rid: str) -> Sequence:
    return Sequence(request_id=rid, token_ids=[1, 2], params=SamplingParams())


def test_messages_come_out_in_order_with_those_put_while_draining() -> None:
    inbox, a, b = Inbox(), seq("a"), seq("b")
    error = Error("INTERNAL", "boom")
    inbox.put(Submit(a))
    inbox.put(Pause(a, True))
    seen: list[Message] = []
    for message in inbox.drain(block=False):
        seen.append(message)
        if isinstance(message, Pause):  # put while the engine handles earlier messages: same drain
            inbox.put(Abort(b, error))
            inbox.put(CancelAll("bye"))
    assert seen == [Submit(a), Pause(a, True), Abort(b, error), CancelAll("bye")]
    assert list(inbox.drain(block=False)) == []


def test_a_blocking_drain_waits_for_the_first_message_at_most_its_timeout() -> None:
    inbox = Inbox()
    t0 = time.monotonic()
    assert list(inbox.drain(block=True, timeout=0.05)) == []
    assert time.monotonic() - t0 >= 0.04
    inbox.put(Wake())
    assert list(inbox.drain(block=True, timeout=5.0)) == [Wake()]
