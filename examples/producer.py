"""Post messages to a queue and wait for the broker's acknowledgements.

Run ``python examples/producer.py [tcp://host:port]``; without an address it starts an
embedded broker for the duration of the example.
"""
from __future__ import annotations

import argparse
from typing import List, Optional

import bmq
from bmq.broker import broker_address

QUEUE = "bmq://bmq.test.mem.priority/example-orders"


def main(broker: Optional[str] = None) -> List[bmq.Ack]:
    """Post one message with properties, one compressed and a batch; return every Ack."""
    with broker_address(broker) as address, bmq.Session(address) as session:
        queue = session.open_queue(QUEUE, write=True)
        # Blocks until the broker acknowledges; a NACK raises bmq.PostError.
        acks = [queue.post(b"order #1", properties={"kind": "new", "qty": 7})]
        # Large payloads can be zlib-compressed per message (only those >= 1 KiB are).
        acks.append(queue.post(b'{"items": [%s]}' % b",".join(b"%d" % i for i in range(500)), compression="zlib"))
        # One call, few PUT events, one Ack per message.
        acks += queue.post_many([b"order #%d" % n for n in range(2, 12)], properties={"kind": "bulk"})
        for ack in acks:
            print(f"{ack.guid_hex} {ack.status.name}")
        return acks


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("broker", nargs="?", help="a broker, e.g. tcp://localhost:30114 (default: an embedded one)")
    main(parser.parse_args().broker)
