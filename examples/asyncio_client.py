"""Use bmq from asyncio code: await acknowledgements with ``asyncio.wrap_future``, receive
pushed messages through ``loop.call_soon_threadsafe``, and run the blocking calls (connect,
open, stop) in a worker thread with ``asyncio.to_thread``.

Run ``python examples/asyncio_client.py [tcp://host:port]``; without an address it starts an
embedded broker.

bmq is thread-based: its futures are :class:`concurrent.futures.Future` objects resolved on
bmq's threads, and callbacks run on the session's dispatcher thread. Neither may touch asyncio
objects directly: ``wrap_future`` and ``call_soon_threadsafe`` hand the result to the loop's
thread. The event loop never blocks on the network.
"""
from __future__ import annotations

import asyncio
import argparse
from typing import List, Optional, Sequence, Tuple, Union

import bmq
from bmq.broker import broker_address

QUEUE = "bmq://bmq.test.mem.priority/example-asyncio"


async def produce(queue: bmq.Queue, payloads: List[bytes]) -> List[bmq.Ack]:
    """Post every payload at once and await all their Acks."""
    return list(await asyncio.gather(*(asyncio.wrap_future(queue.post_async(p)) for p in payloads)))


async def consume(inbox: "asyncio.Queue[bmq.Message]", count: int) -> List[bytes]:
    """Take ``count`` messages from ``inbox`` on the event loop, confirming each one."""
    received: List[bytes] = []
    while len(received) < count:
        message = await asyncio.wait_for(inbox.get(), timeout=10)
        received.append(message.data)
        message.confirm()   # does not wait for the broker: fine on the loop
    return received


async def run(address: Union[str, Sequence[str]], count: int = 10) -> Tuple[List[bmq.Ack], List[bytes]]:
    loop = asyncio.get_running_loop()
    inbox: "asyncio.Queue[bmq.Message]" = asyncio.Queue()

    def on_message(message: bmq.Message) -> None:
        # On bmq's dispatcher thread: hand the message to the loop's thread, nothing more.
        loop.call_soon_threadsafe(inbox.put_nowait, message)

    session = await asyncio.to_thread(bmq.Session, address)
    try:
        queue = await asyncio.to_thread(session.open_queue, QUEUE, read=True, write=True, on_message=on_message)
        consumer = asyncio.create_task(consume(inbox, count))
        acks = await produce(queue, [b"event %d" % n for n in range(count)])
        received = await consumer
    finally:
        await asyncio.to_thread(session.stop)
    return acks, received


def main(broker: Optional[str] = None) -> Tuple[List[bmq.Ack], List[bytes]]:
    """Post ten messages and receive them, all from one event loop; return the Acks and payloads."""
    with broker_address(broker) as address:
        acks, received = asyncio.run(run(address))
    print(f"{sum(ack.ok for ack in acks)} acknowledged, received {sorted(received)[:3]}...")
    return acks, received


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("broker", nargs="?", help="a broker, e.g. tcp://localhost:30114 (default: an embedded one)")
    main(parser.parse_args().broker)
