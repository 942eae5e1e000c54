"""Drain a queue in batches: no Python object per message, one confirm per batch.

Run ``python examples/batch_consumer.py [tcp://host:port]``; without an address it starts an
embedded broker and first posts 100,000 small messages so there is something to drain.

A queue opened with ``batches=True`` hands out :class:`bmq.MessageBatch` objects: the payloads
back to back in one ``bytes``, their offsets (native int32, Arrow's binary layout) and their
GUIDs in two more buffers. Work on whole buffers where you can (here: counting lines and bytes
with ``bytes`` methods, which run at C speed); ``batch.payload(i)`` and ``batch.messages()``
are there for the messages you need one by one.
"""
from __future__ import annotations

import argparse
import time
from typing import Optional, Tuple

import bmq
from bmq.broker import broker_address

QUEUE = "bmq://bmq.test.mem.priority/example-readings"
SEEDED = 100_000


def main(broker: Optional[str] = None, idle_timeout: float = 1.0) -> Tuple[int, int]:
    """Take batches until none arrives for ``idle_timeout`` seconds, confirming each.

    Returns:
        How many messages arrived, and how many of them report an alarm.
    """
    with broker_address(broker) as address, bmq.Session(address) as session:
        if broker is None:  # a fresh embedded broker: post something to drain
            with session.open_queue(QUEUE, write=True) as seeder:
                readings = [b"sensor-%d,%s\n" % (n % 7, b"alarm" if n % 1000 == 0 else b"ok") for n in range(SEEDED)]
                for first in range(0, SEEDED, 10_000):
                    seeder.post_many(readings[first:first + 10_000])
        queue = session.open_queue(QUEUE, read=True, batches=True,
                                   options=bmq.QueueOptions(max_unconfirmed_messages=50_000))
        count = alarms = 0
        started = time.perf_counter()
        while True:
            batch = queue.get_batch(max_messages=20_000, timeout=idle_timeout)
            if batch is None:
                break
            count += len(batch)
            alarms += batch.payloads.count(b",alarm\n")  # one C-speed scan of every payload
            batch.confirm()  # one call, as few CONFIRM events as the protocol allows
            if count == len(batch):
                print(f"first batch: {len(batch)} messages, {len(batch.payloads)} bytes, "
                      f"first payload {batch.payload(0)!r}, first GUID {batch.guid(0).hex().upper()}")
        elapsed = time.perf_counter() - started - idle_timeout  # the last wait found nothing
        print(f"{count} messages ({alarms} alarms) in {max(elapsed, 1e-6):.2f} s")
        return count, alarms


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("broker", nargs="?", help="a broker, e.g. tcp://localhost:30114 (default: an embedded one)")
    main(parser.parse_args().broker)
