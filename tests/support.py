"""Helpers shared by tests that drive sessions (importable: pytest puts tests/ on sys.path)."""
from __future__ import annotations

import contextlib
import itertools
import signal
import threading
import time
from typing import Callable, Iterator, List, Type

import bmq
from bmq import _codec, events

_names = itertools.count()


def fresh_uri(domain: str = "bmq.test.mem.priority", prefix: str = "q") -> str:
    """A queue URI no other test uses, so tests sharing a broker cannot see each other's messages."""
    return f"bmq://{domain}/{prefix}{next(_names)}-{time.monotonic_ns() % 10**9}"


def until(predicate: Callable[[], object], timeout: float) -> bool:
    """Whether ``predicate()`` became true within ``timeout`` seconds, looked at every ms: for
    state another thread changes without signalling anything to wait on."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.001)
    return True


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


def expand_columns(runs: list) -> list:
    """push_columns' runs back as one ``(queue_id, guid, sub_ids, area, new_style, payload)``
    per message (new_style only where there is an area, as a Message reads it)."""
    out = []
    for queue_id, sub_ids, count, guids, payloads, offsets, areas in runs:
        ends = memoryview(offsets).cast("i")
        assert len(ends) == count + 1 and ends[0] == 0 and ends[count] == len(payloads)
        for index in range(count):
            area, new_style = (areas or {}).get(index, (None, None))
            out.append((queue_id, guids[16 * index:16 * index + 16], sub_ids, area, new_style,
                        payloads[ends[index]:ends[index + 1]]))
    return out


def messages_of_push(event: bytes) -> list:
    """iter_push_messages' messages in expand_columns' shape."""
    return [(queue_id, guid, sub_ids, area, new_style if area is not None else None, payload)
            for queue_id, guid, sub_ids, _, area, new_style, payload in _codec.iter_push_messages(event)]


class Interrupted(Exception):
    """Raised by the handler :func:`sigusr1_raises` installs."""


@contextlib.contextmanager
def sigusr1_raises() -> Iterator[None]:
    """While inside, SIGUSR1 raises :class:`Interrupted` in the main thread (as Ctrl-C would
    raise KeyboardInterrupt, without disturbing pytest's own handling of that)."""
    def handler(signum, frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def sigint_at_default() -> None:
    """``preexec_fn`` of a child that must take Ctrl-C (SIGINT) as at a terminal. A shell
    without job control starts its background jobs with SIGINT ignored (CI's pieces are started
    with it at its default again, ``.ci/lib.sh``; a user's ``pytest ... &`` in a script is not),
    and a child inherits that: it would not see the signal the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
