"""coalesce_events: what the writer thread sends when several events are queued.

Consecutive PUT events become one PUT event and consecutive CONFIRM events one CONFIRM event
(the broker's cost is mostly per event); everything else goes through byte for byte, in order,
and no input can make it lose, reorder or invent a message."""
import random

import pytest

from bmq import _codec as codec

GEN = codec.GuidGenerator(9)


def _put(*payloads, flags=codec.PUT_ACK_REQUESTED, properties=None):
    return b"".join(codec.build_put_events(1, GEN.generate(len(payloads)), list(payloads), properties, flags=flags))


def _confirm(count=1):
    return codec.build_confirm_event([(1, GEN.next(), 0) for _ in range(count)])


def _events(data):
    return codec.FrameReader().feed(data)


def _kinds(data):
    return [codec.unpack_event_header(e)[1] for e in _events(data)]


def _puts(data):
    return [m for e in _events(data) if codec.unpack_event_header(e)[1] == codec.EVENT_PUT
            for m in codec.iter_put_messages(e)]


def _confirms(data):
    return [c for e in _events(data) if codec.unpack_event_header(e)[1] == codec.EVENT_CONFIRM
            for c in codec.iter_confirms(e)]


def test_consecutive_puts_and_confirms_become_one_event_each_in_order():
    control = codec.encode_control_event(b'{"x": 1}', codec.ENCODING_JSON)
    items = [_put(b"a"), _put(b"b", b"c"), _confirm(), _confirm(2), _put(b"d", properties=codec.encode_properties(
        {"k": (codec.PROPERTY_INT32, 5)})), control, _put(b"e"), codec.HEARTBEAT_RSP, _confirm()]
    out = codec.coalesce_events(items)
    assert _kinds(out) == [codec.EVENT_PUT, codec.EVENT_CONFIRM, codec.EVENT_PUT, codec.EVENT_CONTROL,
                           codec.EVENT_PUT, codec.EVENT_HEARTBEAT_RSP, codec.EVENT_CONFIRM]
    joined = b"".join(items)
    assert _puts(out) == _puts(joined)
    assert [m[-1][-1:] for m in _puts(out)] == [b"a", b"b", b"c", b"d", b"e"]  # "d" after its properties
    assert _confirms(out) == _confirms(joined)
    assert control in out
    assert len(out) == len(joined) - 8 - 12  # one PUT header and one CONFIRM head dropped


def test_a_single_item_and_an_empty_list():
    event = _put(b"only")
    assert codec.coalesce_events([event]) == event
    assert codec.coalesce_events([]) == b""


def test_bytes_that_are_no_whole_event_go_through_unchanged():
    event = _put(b"a")
    for tail in (b"junk!", event[:5], b"\xff" * 12):
        out = codec.coalesce_events([event, _put(b"b"), tail])
        assert out.endswith(tail)
        assert [m[-1] for m in _puts(out[:-len(tail)])] == [b"a", b"b"]


@pytest.mark.parametrize("seed", range(200))
def test_random_mixes_lose_and_reorder_nothing(seed):
    rnd = random.Random(seed)
    items = []
    for _ in range(rnd.randint(1, 12)):
        kind = rnd.random()
        if kind < 0.5:
            items.append(b"".join(_put(*(rnd.randbytes(rnd.randint(1, 40)) for _ in range(rnd.randint(1, 3))))
                                  for _ in range(rnd.randint(1, 2))))
        elif kind < 0.8:
            items.append(_confirm(rnd.randint(1, 3)))
        elif kind < 0.9:
            items.append(codec.HEARTBEAT_REQ)
        else:  # a hostile event header: odd header words, fragment bit, type-specific bits
            event = bytearray(_put(b"odd"))
            event[rnd.choice([5, 6, 7])] ^= 1
            items.append(bytes(event))
    joined = b"".join(items)
    out = codec.coalesce_events(items)
    assert len(out) <= len(joined)
    if all(codec.unpack_event_header(e)[2:] == (2, 0) for e in _events(joined)):
        assert _puts(out) == _puts(joined)
        assert _confirms(out) == _confirms(joined)
    # Events that cannot be joined are kept byte for byte.
    for event in _events(joined):
        if codec.unpack_event_header(event)[1] not in (codec.EVENT_PUT, codec.EVENT_CONFIRM):
            assert event in out
