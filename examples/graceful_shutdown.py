"""Consume until SIGTERM or Ctrl-C, then stop cleanly: the message in hand is handled and
confirmed, the others stay with the broker for the next consumer.

Run ``python examples/graceful_shutdown.py [tcp://host:port [QUEUE]]`` and press Ctrl-C (or send
``kill -TERM``). Without an address it starts an embedded broker and posts a few messages first.

Why it is written this way: a signal handler runs in the main thread between two bytecodes,
possibly in the middle of your handler; so it only sets a flag, and the loop looks at the flag
between messages. ``get(timeout=...)`` wakes the loop regularly to look at it. A message taken
but not confirmed when the session stops is delivered again, to this or another consumer.
"""
from __future__ import annotations

import argparse
import signal
import threading
from typing import Callable, Optional

import bmq
from bmq.broker import broker_address

QUEUE = "bmq://bmq.test.mem.priority/example-jobs"


def handle(message: bmq.Message) -> None:
    """The application's work for one message (here: print it)."""
    print(f"handled {message.data.decode()}", flush=True)


def consume(queue: bmq.Queue, stopping: threading.Event, work: Callable[[bmq.Message], None] = handle) -> int:
    """Handle and confirm messages until ``stopping`` is set; return how many were handled."""
    handled = 0
    while not stopping.is_set():
        message = queue.get(timeout=0.25)   # wakes up at least every 0.25 s to look at the flag
        if message is None:
            continue
        work(message)                        # the message in hand is always finished...
        message.confirm()                    # ...and confirmed before the flag is looked at
        handled += 1
    return handled


def main(broker: Optional[str] = None, uri: str = QUEUE) -> int:
    """Consume until SIGTERM or SIGINT; return the number of messages handled."""
    stopping = threading.Event()
    previous = {signum: signal.signal(signum, lambda *_: stopping.set()) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        with broker_address(broker) as address, bmq.Session(address) as session:
            queue = session.open_queue(uri, read=True, write=broker is None)
            if broker is None:  # a fresh embedded broker: post something to consume
                queue.post_many([b"job %d" % n for n in range(5)])
            print(f"consuming {uri} (Ctrl-C to stop)", flush=True)
            handled = consume(queue, stopping)
            print(f"stopping after {handled} messages", flush=True)
            # Leaving the block stops the session: what arrived but was not taken goes back to
            # the broker, unconfirmed, for the next consumer.
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return handled


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("broker", nargs="?", help="a broker, e.g. tcp://localhost:30114 (default: an embedded one)")
    parser.add_argument("queue", nargs="?", default=QUEUE, help="the queue to consume (default: %(default)s)")
    arguments = parser.parse_args()
    main(arguments.broker, arguments.queue)
