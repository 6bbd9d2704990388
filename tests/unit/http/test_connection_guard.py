"""The HTTP connection cap's choice of victim (``service.http.connections``): connections that never
completed a request give their place up before kept-alive connections that served one (issue #35:
a half-sent flood reclaimed the health probe's idle connection)."""

from __future__ import annotations

from service.http.connections import ConnectionGuard


class Conn:
    """A connection as the guard sees it: it can be closed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.reclaimed = False

    def reclaim(self) -> None:
        self.reclaimed = True


def served(guard: ConnectionGuard, name: str) -> Conn:
    """A connection that completed one request and now waits idle on keep-alive."""
    conn = Conn(name)
    assert guard.admit(conn)
    guard.in_request(conn)
    guard.awaiting_head(conn)
    return conn


def test_a_flood_of_fresh_connections_never_reclaims_an_idle_connection_that_served_a_request() -> None:
    guard = ConnectionGuard(4)
    probe = served(guard, "probe")
    flood = [Conn(f"flood-{i}") for i in range(100)]
    for conn in flood:
        assert guard.admit(conn)
    assert not probe.reclaimed and probe in guard.open
    assert sum(c.reclaimed for c in flood) == 97  # the cap of 4: the probe and the 3 newest
    assert [c.name for c in flood if not c.reclaimed] == ["flood-97", "flood-98", "flood-99"]
    assert len(guard.open) == 4 and guard.waiting == 4


def test_fresh_connections_go_first_then_idle_ones_oldest_idle_first() -> None:
    guard = ConnectionGuard(3)
    older, newer = served(guard, "older"), served(guard, "newer")
    guard.in_request(older)
    guard.awaiting_head(older)  # served a second request: now the idle one idle the shortest
    f1, f2, f3 = Conn("f1"), Conn("f2"), Conn("f3")
    assert guard.admit(f1) and guard.admit(f2)
    assert f1.reclaimed and not (older.reclaimed or newer.reclaimed)  # a fresh one before any idle one
    guard.in_request(f2)  # f2's head is complete: no fresh connection is left to reclaim
    assert guard.admit(f3)
    assert newer.reclaimed and not older.reclaimed  # the idle one idle longest
    f4 = Conn("f4")
    assert guard.admit(f4) and f3.reclaimed and not older.reclaimed
    assert guard.open == {older, f2, f4}


def test_a_connection_in_a_request_is_never_reclaimed_and_a_full_house_refuses() -> None:
    guard = ConnectionGuard(2)
    busy = [Conn("a"), Conn("b")]
    for conn in busy:
        assert guard.admit(conn)
        guard.in_request(conn)
    assert not guard.admit(Conn("c"))
    assert guard.refused.total == 1 and not any(c.reclaimed for c in busy)
    guard.release(busy[0])
    assert guard.admit(Conn("d")) and len(guard.open) == 2
