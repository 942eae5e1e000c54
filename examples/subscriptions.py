"""Consume only the messages a consumer wants: subscriptions, their priorities and limits.

Run ``python examples/subscriptions.py [tcp://host:port]``; without an address it starts an
embedded broker. It posts orders, then reads them with two subscriptions: big EU orders at
a higher priority, and every other order. See docs/subscriptions.md for the language.
"""
from __future__ import annotations

import argparse
from typing import Dict, List, Optional

import bmq
from bmq.broker import broker_address

QUEUE = "bmq://bmq.test.mem.priority/example-subscriptions"


def main(broker: Optional[str] = None, idle_timeout: float = 1.0) -> Dict[str, List[bytes]]:
    """Post 8 orders, read them back; return the payloads received per subscription."""
    big_eu = bmq.Subscription('region == "EU" && qty >= 100', consumer_priority=10, max_unconfirmed_messages=50)
    options = bmq.QueueOptions(subscriptions=[big_eu, "exists(qty)"])
    try:
        bmq.QueueOptions(subscriptions=['region = "EU"'])
    except bmq.InvalidArgumentError as e:  # checked before anything is sent
        print(f"refused: {e}")
    received: Dict[str, List[bytes]] = {"big EU": [], "other": []}
    with broker_address(broker) as address, bmq.Session(address) as session:
        queue = session.open_queue(QUEUE, read=True, write=True, options=options)
        orders = [("EU", 150), ("US", 150), ("EU", 5), ("EU", 100), ("APAC", 1), ("US", 7), ("EU", 999), ("EU", 99)]
        queue.post_many([b"%s-%d" % (region.encode(), qty) for region, qty in orders],
                        [{"region": region, "qty": qty} for region, qty in orders])
        for message in queue.messages(timeout=idle_timeout):
            name = "big EU" if message.subscription is big_eu else "other"
            print(f"{name:6} {message.data!r} {message.properties}")
            received[name].append(message.data)
            message.confirm()
    return received


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("broker", nargs="?", help="a broker, e.g. tcp://localhost:30114 (default: an embedded one)")
    main(parser.parse_args().broker)
