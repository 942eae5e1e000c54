"""Receive messages from a queue, confirm them, and show the push-mode alternative.

Run ``python examples/consumer.py [tcp://host:port]``; without an address it starts an
embedded broker and first posts a few messages so there is something to receive.
"""
from __future__ import annotations

import argparse
import threading
from typing import List, Optional

import bmq
from bmq.broker import broker_address

QUEUE = "bmq://bmq.test.mem.priority/example-orders"


def main(broker: Optional[str] = None, idle_timeout: float = 1.0) -> List[bytes]:
    """Pull messages until none arrives for ``idle_timeout`` seconds; return their payloads."""
    received = []
    with broker_address(broker) as address, bmq.Session(address) as session:
        if broker is None:  # a fresh embedded broker: post something to receive
            with session.open_queue(QUEUE, write=True) as seeder:
                seeder.post_many([b"order #%d" % n for n in range(5)], {"kind": "new"})
        queue = session.open_queue(QUEUE, read=True, options=bmq.QueueOptions(max_unconfirmed_messages=100))
        batch = []
        for message in queue.messages(timeout=idle_timeout):
            print(f"{message.guid_hex} {message.data!r} {message.properties}")
            received.append(message.data)
            batch.append(message)
            if len(batch) >= 50:
                session.confirm_many(batch)  # one CONFIRM event for the lot
                batch.clear()
        session.confirm_many(batch)
        queue.close()

        # Push mode: the callback runs on the session's dispatcher thread and may call any
        # session method (here: confirm).
        arrived = threading.Event()

        def on_message(message: bmq.Message) -> None:
            message.confirm()
            arrived.set()

        with session.open_queue(QUEUE, read=True, write=True, on_message=on_message) as pushed:
            pushed.post(b"pushed")
            arrived.wait(5.0)
    return received


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("broker", nargs="?", help="a broker, e.g. tcp://localhost:30114 (default: an embedded one)")
    main(parser.parse_args().broker)
