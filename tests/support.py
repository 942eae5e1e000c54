"""Helpers shared by tests that drive sessions (importable: pytest puts tests/ on sys.path)."""
from __future__ import annotations

import itertools
import time

import bmq

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
