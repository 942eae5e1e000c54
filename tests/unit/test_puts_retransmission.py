"""Retransmitted PUTs keep the property encoding they were posted with."""
from __future__ import annotations

import array

from bmq import _codec
from bmq._puts import Batch, PendingPuts

PROPS = {"kind": (_codec.PROPERTY_STRING, "new"), "n": (_codec.PROPERTY_INT32, 7)}


class _Queue:
    queue_id = 3
    uri = "bmq://bmq.test.mem.priority/q"


def _batch(guid: bytes, new_style: bool) -> Batch:
    area = _codec.encode_properties(PROPS, new_style)
    return Batch(_Queue(), [guid], [b"payload"], [area], new_style, _codec.COMPRESSION_NONE, 0.0)


def test_each_message_is_resent_in_the_encoding_of_the_connection_that_posted_it():
    old_guid, new_guid = b"\x40" + b"\x01" * 15, b"\x40" + b"\x02" * 15
    group = [(old_guid, _batch(old_guid, False)), (new_guid, _batch(new_guid, True))]
    (event,) = PendingPuts._retransmission(group, _codec.COMPRESSION_NONE)
    sent = {guid: (schema, app) for _, _, guid, _, _, schema, _, app in _codec.iter_put_messages(event)}
    assert sent[old_guid][0] == 0 and sent[new_guid][0] != 0  # SchemaId 0 = old encoding (protocol §6.4)
    for guid, new_style in ((old_guid, False), (new_guid, True)):
        area, payload = _codec.split_app_data(sent[guid][1], _codec.PUT_MESSAGE_PROPERTIES, 0, sent[guid][0])
        assert payload == b"payload"
        assert _codec.decode_properties(area, new_style) == PROPS


def test_messages_posted_from_a_payload_column_are_resent_whole():
    guids = _codec.derived_guids(b"k", 0, 2)
    column = _codec.PayloadColumn(array.array("i", [0, 3, 1027]), b"abc" + b"d" * 1024, 0, 2)
    batch = Batch(_Queue(), _codec.split_guids(guids), column, None, True, _codec.COMPRESSION_NONE, 0.0)
    (event,) = PendingPuts._retransmission([(guids[16:], batch), (guids[:16], batch)], _codec.COMPRESSION_NONE)
    assert [(guid, app) for _, _, guid, _, _, _, _, app in _codec.iter_put_messages(event)] == [
        (guids[16:], b"d" * 1024), (guids[:16], b"abc")]
