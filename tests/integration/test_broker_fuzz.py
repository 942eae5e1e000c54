"""Hostile input: mutated protocol events never crash a session handler or the broker.

Seeded and bounded. Each case sends one mutated event (bit flips, truncation, length or
field damage) after a valid session set-up; the broker may drop the event, NACK it or close
that connection, but it must never hit its "internal error" path, and it must keep serving.
"""
from __future__ import annotations

import logging
import random
from typing import List

import pytest

from bmq import _codec, _schema
from bmq.broker import Broker
from bmq.broker._rawclient import RawClient

URI = "bmq://bmq.test.mem.priority/fuzz"
SEED = 20261121
CASES = 150

pytestmark = pytest.mark.timeout(120)


def _valid_events(client: RawClient) -> List[bytes]:
    enc = client.encoding
    control = [
        {"rId": 50, "openQueue": {"handleParameters": RawClient.handle_parameters(URI, 1, read=True, write=True)}},
        {"rId": 51, "configureStream": {"qId": 1, "streamParameters": {"appId": "__default"}}},
        {"rId": 52, "configureQueueStream": {"qId": 1, "streamParameters": {"maxUnconfirmedMessages": 5}}},
        {"rId": 53, "closeQueue": {"handleParameters": RawClient.handle_parameters(URI, 1, read=True), "isFinal": False}},
    ]
    events = [_schema.encode_event(_schema.with_defaults(m, "control"), enc, "control") for m in control]
    area = _codec.encode_properties({"a": (_codec.PROPERTY_INT32, 1), "b": (_codec.PROPERTY_STRING, "x")})
    events += _codec.build_put_events(0, client.guids.generate(3), [b"p1", b"p2" * 50, b"p3"], area, flags=1)
    events.append(_codec.build_confirm_event([(0, client.guids.next(), 0)]))
    return events


def _mutate(rng: random.Random, event: bytes) -> bytes:
    data = bytearray(event)
    choice = rng.randrange(5)
    if choice == 0:  # flip a few bits past the length word
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(4, len(data))
            data[position] ^= 1 << rng.randrange(8)
    elif choice == 1:  # truncate, keeping the length word consistent
        cut = rng.randrange(8, len(data))
        data = data[:cut]
        data[0:4] = len(data).to_bytes(4, "big")
    elif choice == 2:  # random bytes in the body
        start = rng.randrange(8, len(data))
        for i in range(start, min(len(data), start + rng.randint(1, 16))):
            data[i] = rng.randrange(256)
    elif choice == 3:  # damage a header byte (type, header words, encoding)
        data[rng.choice((4, 5, 6, 7))] = rng.randrange(256)
    else:  # append junk inside the event
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        data += junk
        data[0:4] = len(data).to_bytes(4, "big")
    return bytes(data)


@pytest.mark.parametrize("encoding", [_codec.ENCODING_JSON, _codec.ENCODING_BER])
def test_mutated_events_never_break_the_broker(caplog: pytest.LogCaptureFixture, encoding: int) -> None:
    rng = random.Random(SEED + encoding)
    caplog.set_level(logging.WARNING, logger="bmq.broker")
    with Broker() as broker:
        client = RawClient(broker.port, encoding=encoding)
        client.open(URI, 0, read=True, write=True)
        valid = _valid_events(client)
        for _ in range(CASES):
            if client.sock.fileno() < 0 or broker.wait_for(lambda: not broker.clients(), 0):
                client.close()
                client = RawClient(broker.port, encoding=encoding)
                client.open(URI, 0, read=True, write=True)
            try:
                client.send(_mutate(rng, rng.choice(valid)))
            except OSError:
                client.close()
                client = RawClient(broker.port, encoding=encoding)
                client.open(URI, 0, read=True, write=True)
        client.close()
        with RawClient(broker.port) as probe:
            probe.open(URI, 0, write=True)
            [guid] = probe.put(0, [b"still serving"])
            assert probe.acks(1)[0][:3] == (0, 0, guid)
    crashes = [r.getMessage() for r in caplog.records if "internal error" in r.getMessage() or r.levelno >= logging.ERROR]
    assert crashes == []
