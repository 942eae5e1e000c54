"""Property and fuzz tests for bmq._schema: generated messages of every type round-trip in
both encodings; mutated and random bodies only ever raise ProtocolError."""
from __future__ import annotations

import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bmq import _ctrlmsg as ctrlmsg
from bmq import _schema as schema
from bmq.exceptions import ProtocolError

BER, JSON = schema.ENCODING_BER, schema.ENCODING_JSON
KINDS = (schema.KIND_NEGOTIATION, schema.KIND_CONTROL, schema.KIND_AUTHENTICATION)

# Strings without lone surrogates: JSON needs valid Unicode, and BER strings are UTF-8.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


def _value(type_name: str, array: bool, non_empty_arrays: bool) -> st.SearchStrategy:
    """A strategy for one element, derived from the schema table itself."""
    if array:
        return st.lists(_value(type_name, False, non_empty_arrays), min_size=1 if non_empty_arrays else 0,
                        max_size=3)
    if type_name in ctrlmsg.FIELDS:
        return st.deferred(lambda: _sequence(type_name, non_empty_arrays))
    if type_name in ctrlmsg.INT_RANGES:
        low, high = ctrlmsg.INT_RANGES[type_name]
        return st.integers(low, high)
    if type_name in ctrlmsg.ENUMS:
        return st.sampled_from(sorted(ctrlmsg.ENUMS[type_name]))
    return {"boolean": st.booleans(), "string": TEXT, "base64Binary": st.binary(max_size=20)}[type_name]


def _sequence(seq: str, non_empty_arrays: bool) -> st.SearchStrategy:
    """Any subset of the sequence's elements (encoders write exactly what is present)."""
    named = {f.name: _value(f.type, f.array, non_empty_arrays) for f in ctrlmsg.FIELDS[seq] if f.name}
    base = st.fixed_dictionaries({}, optional=named)
    for f in ctrlmsg.FIELDS[seq]:
        if f.name is None:
            selections = st.one_of([
                st.tuples(st.just(name), _value(type_name, False, non_empty_arrays))
                for name, (_, type_name) in ctrlmsg.CHOICE_BY_NAME[f.type].items()
            ])
            base = st.tuples(base, selections).map(lambda pair: {**pair[0], pair[1][0]: pair[1][1]})
    return base


def _messages(non_empty_arrays: bool) -> st.SearchStrategy:
    return st.sampled_from(KINDS).flatmap(
        lambda kind: st.tuples(st.just(kind), _sequence(ctrlmsg.TOP_TYPES[kind], non_empty_arrays)))


ROUND_TRIP = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@ROUND_TRIP
@given(_messages(non_empty_arrays=False))
def test_ber_round_trip(kind_msg):
    kind, msg = kind_msg
    body = schema.encode_body(msg, BER, kind)
    assert schema.decode_body(body, BER, kind) == msg


@ROUND_TRIP
@given(_messages(non_empty_arrays=True))  # JSON omits empty arrays, as baljsn does
def test_json_round_trip(kind_msg):
    kind, msg = kind_msg
    body = schema.encode_body(msg, JSON, kind)
    assert schema.decode_body(body, JSON, kind) == msg


@ROUND_TRIP
@given(_messages(non_empty_arrays=True))
def test_with_defaults_is_idempotent_and_encodes_alike(kind_msg):
    kind, msg = kind_msg
    filled = schema.with_defaults(msg, kind)
    assert schema.with_defaults(filled, kind) == filled
    assert schema.decode_body(schema.encode_body(filled, BER, kind), BER, kind) == filled
    # JSON drops the empty arrays that with_defaults adds; filling again restores them
    from_json = schema.decode_body(schema.encode_body(filled, JSON, kind), JSON, kind)
    assert schema.with_defaults(from_json, kind) == filled


def _corpus() -> list[tuple[str, int, bytes]]:
    """Valid bodies of every selection, both encodings, defaults filled in."""
    rng = random.Random(1)
    seeds = []
    for _ in range(60):
        kind, msg = _example(rng)
        for encoding in (BER, JSON):
            seeds.append((kind, encoding, schema.encode_body(msg, encoding, kind)))
    return seeds


def _example(rng: random.Random) -> tuple[str, dict]:
    """A filled message of a random selection (deterministic, unlike strategy.example())."""
    kind = rng.choice(KINDS)
    top = ctrlmsg.TOP_TYPES[kind]
    msg = {}
    for f in ctrlmsg.FIELDS[top]:
        if f.name is None:
            name, (_, type_name) = rng.choice(sorted(ctrlmsg.CHOICE_BY_NAME[f.type].items()))
            msg[name] = {}
        elif rng.random() < 0.5:
            msg[f.name] = rng.randrange(1 << 20)
    filled = schema.with_defaults(msg, kind)
    _decorate(filled, rng)
    return kind, filled


def _decorate(value, rng: random.Random) -> None:
    """Give strings some content and arrays an element so mutations hit every element type."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str) and not item.startswith("E_"):
                value[key] = rng.choice(["bmq://d/q?id=x", "é/€", "x" * 200])
            elif key in ("subscriptions", "consumers") and not item:
                value[key] = [{"sId": 1, "expression": {"text": "a > 1"}, "consumers": [{"consumerPriority": 3}]}
                              if key == "subscriptions" else {"maxUnconfirmedBytes": 1 << 40}]
            else:
                _decorate(item, rng)
    elif isinstance(value, list):
        for item in value:
            _decorate(item, rng)


def _mutate(body: bytes, rng: random.Random, corpus: list) -> bytes:
    data = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        pos = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[pos % len(data)] = rng.randrange(256)
        elif op == 1 and data:
            data[pos % len(data)] ^= 1 << rng.randrange(8)
        elif op == 2:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 3:
            del data[pos:pos + rng.randint(1, 8)]
        elif op == 4:
            del data[pos:]
        elif op == 5:
            other = rng.choice(corpus)[2]
            start = rng.randrange(len(other))
            data[pos:pos] = other[start:start + rng.randint(1, 32)]
        else:
            data[pos:pos] = rng.choice([b"\x80", b"\x00\x00", b"\xa0\x80", b"\x30\x80", b"\x84\xff\xff\xff\xff",
                                        b'"', b"{", b"}", b"[", b"\\u", b"null", b"-", b"1e9"])
    return bytes(data)


@pytest.mark.slow
def test_fuzz_decode_only_raises_protocol_error():
    rng = random.Random(20261121)
    corpus = _corpus()
    decoded = 0
    # CPU time of this thread, not wall time: the bound is for a decoder gone pathological
    # (2 s of CPU here), and wall time grows with whatever else runs on the machine
    # (11.7 s beside four busy loops).
    started = time.thread_time()
    total = 120_000
    for i in range(total):
        kind, encoding, body = rng.choice(corpus)
        if i % 20 == 0:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        else:
            body = _mutate(body, rng, corpus)
        try:
            msg = schema.decode_body(body, encoding, kind)
        except ProtocolError:
            continue
        decoded += 1
        # whatever decodes must re-encode and decode to the same thing (in BER always;
        # JSON drops empty arrays)
        again = schema.encode_body(msg, BER, kind)
        assert schema.decode_body(again, BER, kind) == msg
    cpu = time.thread_time() - started
    assert 0 < decoded < total  # some mutations survive, most do not
    assert cpu < 30, f"fuzzing {total} bodies took {cpu:.1f} s of CPU"
