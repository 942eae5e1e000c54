"""Helpers shared by tests that drive sessions (importable: pytest puts tests/ on sys.path)."""
from __future__ import annotations

import itertools
import time
from typing import List, Type

import bmq
from bmq import events

_names = itertools.count()


def fresh_uri(domain: str = "bmq.test.mem.priority", prefix: str = "q") -> str:
    """A queue URI no other test uses, so tests sharing a broker cannot see each other's messages."""
    return f"bmq://{domain}/{prefix}{next(_names)}-{time.monotonic_ns() % 10**9}"


def drain(queue: bmq.Queue, count: int, timeout: float = 10.0) -> list:
    """Messages taken from ``queue`` until ``count`` arrived or ``timeout`` seconds passed."""
    received = []
    deadline = time.monotonic() + timeout
    while len(received) < count and time.monotonic() < deadline:
        message = queue.get(timeout=max(0.0, deadline - time.monotonic()))
        if message is not None:
            received.append(message)
    return received


# Reconnect at once (tests inject the failures and want the recovery quickly).
FAST_RECONNECT = bmq.ReconnectPolicy(initial_delay=0.01, max_delay=0.2, jitter=0.2)


def ha_options(**kwargs) -> bmq.SessionOptions:
    """SessionOptions with :data:`FAST_RECONNECT` unless ``reconnect`` is given."""
    kwargs.setdefault("reconnect", FAST_RECONNECT)
    return bmq.SessionOptions(**kwargs)


def wait_event(session: bmq.Session, kind: Type[events.SessionEvent], timeout: float = 10.0) -> List:
    """Events up to and including the first of ``kind``; AssertionError if none comes in time."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = session.next_event(max(0.0, deadline - time.monotonic()))
        if event is None:
            break
        seen.append(event)
        if isinstance(event, kind):
            return seen
    raise AssertionError(f"no {kind.__name__} within {timeout} s; saw {seen}")
