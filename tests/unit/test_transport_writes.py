"""Transport writes: whichever thread writes (the sender itself, or the writer thread), and
however queued events are joined, the peer receives every message once, each sender's in
order, and the byte counters agree with what arrived."""
from __future__ import annotations

import socket
import threading
from typing import List

from bmq import _codec
from bmq._transport import Transport

SENDERS, EACH = 4, 3000


def test_streams_of_coalescing_sends_arrive_whole_and_in_order_per_sender():
    server = socket.create_server(("127.0.0.1", 0))
    events: List[bytes] = []
    done = threading.Event()

    def serve() -> None:  # reads up to the marker sent after everything
        frames = _codec.FrameReader()
        conn, _ = server.accept()
        with conn:
            while not done.is_set():
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                for event in frames.feed(chunk):
                    events.append(event)
                    if _codec.unpack_event_header(event)[1] == _codec.EVENT_HEARTBEAT_RSP:
                        done.set()

    threading.Thread(target=serve, daemon=True).start()
    transport = Transport(server.getsockname(), lambda *_: None, lambda exc: None, 64 << 20, "test")
    transport.connect(5.0)
    guids = _codec.GuidGenerator(4)

    def send(sender: int) -> None:
        for i in range(EACH):
            event = _codec.build_put_events(sender, guids.generate(1), [b"%d:%d" % (sender, i)])[0]
            transport.send(event, 5.0, coalesce=(i % 10 != 0))  # mostly coalescing, some direct

    threads = [threading.Thread(target=send, args=(n,)) for n in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    transport.send_control(_codec.HEARTBEAT_RSP)  # a marker after everything
    assert done.wait(30)
    transport.close()
    transport.join(5.0)
    server.close()
    assert transport.bytes_out == sum(map(len, events))
    puts = [event for event in events if _codec.unpack_event_header(event)[1] == _codec.EVENT_PUT]
    assert len(puts) < SENDERS * EACH  # queued PUTs were joined into fewer events
    by_sender: List[List[int]] = [[] for _ in range(SENDERS)]
    for event in puts:
        for message in _codec.iter_put_messages(event):
            sender, index = message[-1].split(b":")
            by_sender[int(sender)].append(int(index))
    assert by_sender == [list(range(EACH))] * SENDERS
