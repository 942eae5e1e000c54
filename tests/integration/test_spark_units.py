"""The Spark source's logic without a JVM: options, column mapping, stream offsets and commits.

The client is replaced by small fakes so that the offset/commit/replay rules of the stream
reader and the GUID rules of the writer are checked exactly and fast.
"""
from __future__ import annotations

import array
import datetime
import itertools
import os
import pickle
import threading
from typing import Any, List, Optional, Tuple

import pytest

pytestmark = pytest.mark.spark

try:
    import pyarrow as pa
    from pyspark.sql.types import (
        BinaryType,
        ByteType,
        DoubleType,
        IntegerType,
        LongType,
        MapType,
        ShortType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )
except ImportError as e:  # pyspark is the optional 'spark' extra; CI must have it
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"pyspark>=4 and pyarrow are needed: pip install 'bmq[spark]' ({e})", allow_module_level=True)

try:
    from pyspark.sql.streaming.datasource import ReadAllAvailable
except ImportError:  # pyspark < 4.2 passes latestOffset() no start and no read limit

    def ReadAllAvailable() -> None:  # type: ignore[misc]  # noqa: N802
        return None

import bmq  # noqa: E402
from bmq import _codec  # noqa: E402
from bmq.spark import _schema, _session, _stream, _writer  # noqa: E402
from bmq.spark._options import ReadOptions, StreamOptions, WriteOptions  # noqa: E402
from bmq.spark._reader import BlazingMQReader  # noqa: E402
from bmq.spark._source import BlazingMQDataSource  # noqa: E402
from realbroker import free_port  # noqa: E402

QUEUE = "bmq://bmq.test.mem.priority/spark-unit"


# ---- fakes ----------------------------------------------------------------------------


class FakeMessage:
    def __init__(self, index: int, properties: Optional[dict] = None):
        self.data = f"m{index}".encode()
        self.guid = index.to_bytes(16, "big")
        self.queue_uri = QUEUE
        self.properties = properties or {}


_KINDS = {bool: bmq.PropertyType.BOOL, int: bmq.PropertyType.INT64, str: bmq.PropertyType.STRING,
          bytes: bmq.PropertyType.BINARY}


def batch_of(messages: List[FakeMessage], queue: Any) -> bmq.MessageBatch:
    """A real MessageBatch of ``messages``, as the client would build it from a PUSH event."""
    offsets = [0]
    for message in messages:
        offsets.append(offsets[-1] + len(message.data))
    areas = {
        index: (_codec.encode_properties({k: (int(_KINDS[type(v)]), v) for k, v in m.properties.items()}), True)
        for index, m in enumerate(messages) if m.properties
    }
    return bmq.MessageBatch(queue, b"".join(m.guid for m in messages), b"".join(m.data for m in messages),
                            array.array("i", offsets).tobytes(), areas or None)


class FakeBatch:
    """What the schema's batch factory reads of a MessageBatch, with properties of any value
    (a real batch only holds what the wire can carry)."""

    def __init__(self, messages: List[FakeMessage]):
        self._messages = messages
        self.queue_uri = QUEUE
        self.guids = b"".join(m.guid for m in messages)
        self.payloads = b"".join(m.data for m in messages)
        self.offsets = memoryview(array.array("i", [0, *itertools.accumulate(len(m.data) for m in messages)]))
        self.has_properties = any(m.properties for m in messages)

    def __len__(self) -> int:
        return len(self._messages)

    def all_properties(self) -> List[dict]:
        return [m.properties for m in self._messages]


class FakeConsumer:
    """Session + queue of a reader, standing in for the broker: ``get_batch`` hands out
    waiting messages as a MessageBatch (waiting up to ``timeout`` for one), confirms are
    recorded, and stopping the session puts its unconfirmed messages back in front for the
    next session (redelivery)."""

    uri = QUEUE

    def __init__(self, messages: List[FakeMessage]):
        self.waiting = list(messages)
        self.undelivered: List[FakeMessage] = []
        self.unconfirmed: List[FakeMessage] = []
        self.confirmed: List[FakeMessage] = []
        self.closed = False
        self.empty_polls = 0
        self.held_asked = 0
        self._changed = threading.Condition()
        self._session = self  # MessageBatch.confirm() goes through the queue's session

    def held(self) -> int:
        """What the broker's admin statistics would count: every message not confirmed yet,
        delivered (waiting, unconfirmed) or still in the broker (``undelivered``)."""
        with self._changed:
            self.held_asked += 1
            return len(self.waiting) + len(self.unconfirmed) + len(self.undelivered)

    def release(self) -> None:
        """The broker starts delivering what it held back (its start-up delay ends)."""
        with self._changed:
            self.waiting.extend(self.undelivered)
            self.undelivered = []
            self._changed.notify_all()

    def open(self) -> "FakeConsumer":
        self.closed = False
        return self

    def deliver(self, message: FakeMessage) -> None:
        with self._changed:
            self.waiting.append(message)
            self._changed.notify_all()

    def get_batch(self, max_messages: int, timeout: Optional[float] = None,
                  max_bytes: Optional[int] = None) -> Optional[bmq.MessageBatch]:
        with self._changed:
            if not self._changed.wait_for(lambda: self.waiting or self.closed, timeout):
                self.empty_polls += 1
                self._changed.notify_all()
                return None
            if self.closed:
                raise bmq.QueueStateError(f"{QUEUE} is closed")
            taken = [self.waiting.pop(0)]
            size = len(taken[0].data)
            while self.waiting and len(taken) < max_messages and (max_bytes is None or size < max_bytes):
                taken.append(self.waiting.pop(0))
                size += len(taken[-1].data)
            self.unconfirmed.extend(taken)
            return batch_of(taken, self)

    def _confirm_batch(self, batch: bmq.MessageBatch) -> None:
        guids = {batch.guid(index) for index in range(len(batch))}
        self.confirm_many([message for message in self.unconfirmed if message.guid in guids])

    def wait_for_empty_polls(self, count: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.empty_polls >= count, timeout=30)

    def confirm_many(self, messages: List[FakeMessage]) -> None:
        with self._changed:
            self.confirmed.extend(messages)
            done = {id(message) for message in messages}
            self.unconfirmed = [message for message in self.unconfirmed if id(message) not in done]

    def stop(self) -> None:
        with self._changed:
            self.closed = True
            self.waiting[:0] = self.unconfirmed
            self.unconfirmed = []
            self._changed.notify_all()


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> FakeConsumer:
    fake = FakeConsumer([FakeMessage(i, {"n": i}) for i in range(25)])
    monkeypatch.setattr(_session, "open_consumer", lambda options, max_messages, max_bytes: (fake.open(), fake))
    monkeypatch.setattr(_session, "held_messages", lambda options: fake.held())
    return fake


def read_struct(*extra: StructField) -> StructType:
    return StructType(list(_schema.READ_FIELDS) + list(extra))


def stream_reader(per_batch: int = 10, partitions: int = 2) -> _stream.BlazingMQStreamReader:
    options = StreamOptions.parse(
        {"queue": QUEUE, "maxMessagesPerBatch": str(per_batch), "pollTimeout": "0.2", "numPartitions": str(partitions)}
    )
    return _stream.BlazingMQStreamReader(options, read_struct())


def rows_of(batches: Any) -> List[tuple]:
    """Record batches as row tuples (maps as dicts), as Spark would see them."""
    return [
        tuple(dict(value) if isinstance(value, list) else value for value in row.values())
        for records in batches
        for row in records.to_pylist()
    ]


def replay(reader: _stream.BlazingMQStreamReader, start: dict, end: dict) -> List[tuple]:
    """The rows Spark's executors get for ``(start, end]``: the partitions pickled to a copy of
    the reader, as Spark ships them."""
    executor = pickle.loads(pickle.dumps(reader))
    shipped = [pickle.loads(pickle.dumps(part)) for part in reader.partitions(start, end)]
    return [row for part in shipped for row in rows_of(executor.read(part))]


def take(reader: _stream.BlazingMQStreamReader, start: dict) -> Tuple[List[tuple], dict]:
    """One micro-batch as Spark plans it: the end offset, then the rows in between."""
    end = reader.latestOffset(start, ReadAllAvailable())
    return replay(reader, start, end), end


def test_missing_pyspark_names_the_extra_to_install() -> None:
    import subprocess
    import sys

    code = "import sys; sys.modules['pyspark'] = None; import bmq.spark"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "pip install 'bmq[spark]'" in result.stderr


# ---- options ----------------------------------------------------------------------------


def test_options_defaults_and_parsing() -> None:
    options = StreamOptions.parse({"queue": QUEUE, "maxMessagesPerBatch": "500", "pollTimeout": "0.1"})
    assert (options.broker, options.max_messages_per_batch, options.poll_timeout) == ("tcp://localhost:30114", 500, 0.1)
    defaults = StreamOptions.parse({"queue": QUEUE})
    assert (defaults.max_messages_per_batch, defaults.max_bytes_per_batch, defaults.num_partitions) == (
        200_000, 32 * 1024 * 1024, 2)
    write = WriteOptions.parse({"queue": QUEUE, "broker": "tcp://h:1", "propertyColumns": "a, b"})
    assert (write.broker, write.property_columns, write.guid_column) == ("tcp://h:1", ("a", "b"), None)
    read = ReadOptions.parse({"queue": QUEUE, "confirm": "false", "numPartitions": "3"})
    assert (read.confirm, read.num_partitions, read.max_messages, read.subscription) == (False, 3, 10_000, "")
    assert ReadOptions.parse({"queue": QUEUE, "subscription": 'tag == "x"'}).subscription == 'tag == "x"'
    assert StreamOptions.parse({"queue": QUEUE, "subscription": "i > 1"}).subscription == "i > 1"


@pytest.mark.parametrize("parse", [ReadOptions.parse, StreamOptions.parse])
def test_a_wrong_subscription_option_fails_on_the_driver_naming_offset_and_reason(parse) -> None:
    with pytest.raises(bmq.InvalidArgumentError, match=r"option 'subscription'.*'i >>> 1'.*syntax error.*offset 3"):
        parse({"queue": QUEUE, "subscription": "i >>> 1"})


def test_comma_separated_brokers_are_the_sessions_failover_list(broker) -> None:
    dead = "tcp://127.0.0.1:%d" % free_port()
    options = WriteOptions.parse({"queue": QUEUE, "broker": f"{dead}, {broker.address}"})
    with _session.connect(options) as session:
        assert session.brokers.configured == (dead, broker.address) and session.broker == broker.address


@pytest.mark.parametrize(
    "options, text",
    [
        ({}, "'queue' option is required"),
        ({"queue": "not-a-uri"}, "bmq://"),
        ({"queue": QUEUE, "maxMessagesPerBatch": "0"}, "maxMessagesPerBatch"),
        ({"queue": QUEUE, "maxMessagesPerBatch": "ten"}, "maxMessagesPerBatch"),
        ({"queue": QUEUE, "pollTimeout": "-1"}, "pollTimeout"),
        ({"queue": QUEUE, "maxBytesPerBatch": str(2**31)}, "maxBytesPerBatch.*at most 1 GiB"),
        ({"queue": QUEUE, "numPartitions": "0"}, "numPartitions"),
    ],
)
def test_bad_options_are_rejected_with_their_name(options: dict, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        StreamOptions.parse(options)


# ---- write side: column contract --------------------------------------------------------

KEYED_SCHEMA = StructType([StructField("data", StringType()), StructField("key", StringType())])
WRITE_SCHEMA = StructType(
    [
        StructField("data", StringType()),
        StructField("properties", MapType(StringType(), LongType())),
        StructField("tag", StringType()),
        StructField("key", StringType()),
    ]
)


def test_write_layout_maps_payload_map_and_promoted_columns() -> None:
    layout = _schema.WriteLayout.of(WRITE_SCHEMA, ["tag"], None)
    batch = pa.record_batch(
        {
            "data": ["a", "b"],
            "properties": pa.array([[("n", 1)], None], type=pa.map_(pa.string(), pa.int64())),
            "tag": ["x", None],
            "key": ["k1", "k2"],
        }
    )
    assert list(layout.payloads(batch)) == [b"a", b"b"]
    assert layout.properties(batch) == [
        {"n": (_codec.PROPERTY_INT64, 1), "tag": (_codec.PROPERTY_STRING, "x")},
        None,
    ]
    assert layout.guid_keys(batch) is None


@pytest.mark.parametrize("kind", [pa.binary(), pa.string(), pa.large_binary(), pa.large_string()])
def test_payloads_come_from_the_arrow_buffers_of_a_sliced_column(kind: Any) -> None:
    layout = _schema.WriteLayout.of(KEYED_SCHEMA, [], "key")
    values = [b"first", b"\xc3\xa9t\xc3\xa9", b"x" * 3000, b"z"]
    column = pa.array(values if kind in (pa.binary(), pa.large_binary()) else [v.decode() for v in values], kind)
    batch = pa.RecordBatch.from_arrays([column, column], names=["data", "key"]).slice(1, 2)
    assert list(layout.payloads(batch)) == values[1:3]
    assert list(layout.guid_keys(batch)) == values[1:3]


def test_a_null_payload_or_key_is_refused() -> None:
    layout = _schema.WriteLayout.of(KEYED_SCHEMA, [], "key")
    with pytest.raises(ValueError, match="'data' holds a null"):
        layout.payloads(pa.record_batch({"data": ["a", None], "key": ["k", "l"]}))
    with pytest.raises(ValueError, match="guidColumn 'key' holds a null"):
        layout.guid_keys(pa.record_batch({"data": ["a", "b"], "key": [None, "l"]}))


def test_write_layout_struct_properties_keep_spark_types() -> None:
    schema = StructType(
        [
            StructField("data", BinaryType()),
            StructField("properties", StructType([StructField("i", IntegerType()), StructField("b", BinaryType())])),
        ]
    )
    layout = _schema.WriteLayout.of(schema, [], None)
    batch = pa.record_batch(
        {
            "data": [b"p"],
            "properties": pa.array([{"i": 7, "b": b"\x00"}], type=pa.struct([("i", pa.int32()), ("b", pa.binary())])),
        }
    )
    assert layout.properties(batch) == [{"i": (_codec.PROPERTY_INT32, 7), "b": (_codec.PROPERTY_BINARY, b"\x00")}]


@pytest.mark.parametrize(
    "schema, columns, text",
    [
        (StructType([StructField("payload", BinaryType())]), [], "needs a 'data' column"),
        (StructType([StructField("data", IntegerType())]), [], "must be binary or string"),
        (
            StructType(
                [StructField("data", BinaryType()), StructField("properties", MapType(StringType(), DoubleType()))]
            ),
            [],
            "map value has type double",
        ),
        (StructType([StructField("data", BinaryType()), StructField("properties", StringType())]), [], "map<string"),
        (
            StructType([StructField("data", BinaryType()), StructField("t", TimestampType())]),
            ["t"],
            "property column 't'",
        ),
        (StructType([StructField("data", BinaryType())]), ["nope"], "does not have"),
    ],
)
def test_write_layout_rejects_wrong_columns(schema: StructType, columns: List[str], text: str) -> None:
    with pytest.raises(TypeError, match=text):
        _schema.WriteLayout.of(schema, columns, None)


class FakeProducerQueue:
    """Acknowledges at once; refuses a repeated GUID as the client refuses one still in flight."""

    def __init__(self, nack: bool = False):
        self.posts: List[tuple] = []
        self.nack = nack
        self.guids: set = set()

    def post_many(
        self, payloads: List[bytes], properties: Any = None, *, property_types: Any = None, guids: bytes = b"",
        timeout: Optional[float] = None,
    ) -> List[bmq.Ack]:
        chunks = [guids[i : i + 16] for i in range(0, len(guids), 16)]
        if len(chunks) != len(payloads) or self.guids.intersection(chunks) or len(set(chunks)) != len(chunks):
            raise bmq.InvalidArgumentError("the same GUID appears twice")
        self.guids.update(chunks)
        self.posts.append((payloads, properties, guids))
        status = bmq.AckStatus.LIMIT_MESSAGES if self.nack else bmq.AckStatus.SUCCESS
        acks = [bmq.Ack(status, chunk, QUEUE) for chunk in chunks]
        if self.nack:
            raise bmq.PostError(f"{len(acks)} NACKed", acks)
        return acks


def _post(
    rows: List[str], scope: bytes, partition: int, queue: FakeProducerQueue, guid_column: Optional[str] = None
) -> bytes:
    options = WriteOptions.parse({"queue": QUEUE})
    layout = _schema.WriteLayout.of(KEYED_SCHEMA, [], guid_column)
    poster = _writer._PartitionPoster(queue, layout, options, scope, partition)
    for start in range(0, len(rows), 3):  # several Arrow batches per partition
        chunk = rows[start : start + 3]
        poster.post(pa.record_batch({"data": chunk, "key": [f"k-{r}" for r in chunk]}))
    poster.finish()
    return b"".join(guids for _, _, guids in queue.posts)


def test_guids_are_a_function_of_scope_partition_and_row_index() -> None:
    rows = [f"r{i}" for i in range(10)]
    first = _post(rows, b"write-1", 0, FakeProducerQueue())
    retry = _post(rows, b"write-1", 0, FakeProducerQueue())
    other_partition = _post(rows, b"write-1", 1, FakeProducerQueue())
    other_write = _post(rows, b"write-2", 0, FakeProducerQueue())
    assert first == retry
    assert len({first[i : i + 16] for i in range(0, len(first), 16)}) == 10
    assert first != other_partition and first != other_write
    # A retry that stopped half-way reproduces the same prefix.
    assert _post(rows[:5], b"write-1", 0, FakeProducerQueue()) == first[: 5 * 16]


def test_a_batch_is_posted_as_one_column_of_the_arrow_buffers() -> None:
    """No key column and one property layout: post_many gets the batch's own buffers (a
    PayloadColumn), not a bytes object per row."""
    queue = FakeProducerQueue()
    _post(["a", "bb", "ccc", "d"], b"w", 0, queue)
    assert [type(payloads) for payloads, _, _ in queue.posts] == [_codec.PayloadColumn] * 2
    assert [list(payloads) for payloads, _, _ in queue.posts] == [[b"a", b"bb", b"ccc"], [b"d"]]


def test_guid_column_keys_guids_independently_of_position() -> None:
    forward = _post(["a", "b", "c"], b"w", 0, FakeProducerQueue(), guid_column="key")
    backward = _post(["c", "b", "a"], b"w", 7, FakeProducerQueue(), guid_column="key")
    assert [forward[i : i + 16] for i in (0, 16, 32)] == [backward[i : i + 16] for i in (32, 16, 0)]


def test_repeated_guid_column_keys_post_the_first_row_once() -> None:
    schema = StructType(
        [StructField("data", StringType()), StructField("key", StringType()), StructField("n", LongType())]
    )
    options = WriteOptions.parse({"queue": QUEUE, "propertyColumns": "n"})
    queue = FakeProducerQueue()
    poster = _writer._PartitionPoster(queue, _schema.WriteLayout.of(schema, ["n"], "key"), options, b"w", 0)
    # Repeats within one Arrow batch, across batches, and a batch made only of repeats.
    for data, keys in ((["a", "b", "c"], ["k1", "k1", "k2"]), (["d", "e"], ["k2", "k3"]), (["f"], ["k1"])):
        poster.post(pa.record_batch({"data": data, "key": keys, "n": list(range(len(data)))}))
    poster.finish()
    assert [payload for payloads, _, _ in queue.posts for payload in payloads] == [b"a", b"c", b"e"]
    assert [props for _, values, _ in queue.posts for props in values] == [{"n": 0}, {"n": 2}, {"n": 1}]
    assert (poster.posted, poster.duplicates) == (3, 3)
    keyed = b"".join(guids for _, _, guids in queue.posts)
    assert keyed == b"".join(bmq.deterministic_guid(QUEUE.encode() + b"\0" + k) for k in (b"k1", b"k2", b"k3"))


def test_rows_are_grouped_by_the_type_overrides_they_need() -> None:
    long, text = _codec.PROPERTY_INT64, _codec.PROPERTY_STRING
    groups = _writer._by_type_overrides(
        [{"n": (long, 1), "s": (text, "a")}, {"s": (text, "b")}, None, {"n": (long, 2)}]
    )
    assert groups == [
        ([0, 3], [{"n": 1, "s": "a"}, {"n": 2}], {"n": bmq.PropertyType.INT64}),
        ([1, 2], [{"s": "b"}, None], None),
    ]


def test_nacks_fail_the_task_with_their_statuses() -> None:
    with pytest.raises(bmq.PostError, match="LIMIT_MESSAGES") as caught:
        _post(["a", "b"], b"w", 0, FakeProducerQueue(nack=True))
    assert len(caught.value.acks) == 2


# ---- read side: schema and rows ------------------------------------------------------------


def test_read_schema_and_typed_property_columns() -> None:
    assert _schema.read_schema("n INT, tag STRING") == (
        "data binary, properties map<string,string>, guid string, queue string, received timestamp, n INT, tag STRING"
    )
    schema = read_struct(
        StructField("n", IntegerType()), StructField("tag", StringType()), StructField("raw", BinaryType())
    )
    make = _schema.RowBuilder(schema)
    now = datetime.datetime.now(datetime.timezone.utc)
    records = make(FakeBatch([FakeMessage(3, {"n": 3, "raw": b"\x01\x02", "flag": True}), FakeMessage(4)]), now)
    # Exactly the Arrow schema Spark expects of a Python data source with this schema, and
    # buffers that Arrow accepts as valid.
    assert records.schema.equals(_schema.arrow_schema(schema))
    records.validate(full=True)
    assert rows_of([records]) == [
        (b"m3", {"n": "3", "raw": "0102", "flag": "true"}, (3).to_bytes(16, "big").hex().upper(), QUEUE, now, 3, None,
         b"\x01\x02"),
        (b"m4", {}, (4).to_bytes(16, "big").hex().upper(), QUEUE, now, None, None, None),
    ]


@pytest.mark.parametrize(
    "data_type, low, high",
    [
        (ByteType(), -(2**7), 2**7 - 1),
        (ShortType(), -(2**15), 2**15 - 1),
        (IntegerType(), -(2**31), 2**31 - 1),
        (LongType(), -(2**63), 2**63 - 1),
    ],
)
def test_typed_integer_column_is_null_where_the_value_does_not_fit(data_type: Any, low: int, high: int) -> None:
    make = _schema.RowBuilder(read_struct(StructField("n", data_type)))
    now = datetime.datetime.now(datetime.timezone.utc)

    def typed(*values: Any) -> List[Any]:
        return [row[-1] for row in rows_of([make(FakeBatch([FakeMessage(0, {"n": value}) for value in values]), now)])]

    assert typed(low, high, str(high), b"\x80") == [low, high, high, -128]
    too_wide = [low - 1, high + 1, str(high + 1), 2**40 if high < 2**40 else 2**64]
    assert typed(*too_wide) == [None] * 4
    assert typed(True, "x", b"ab") == [None] * 3


def test_read_schema_rejects_a_clash_and_a_foreign_schema() -> None:
    with pytest.raises(ValueError, match="clashes"):
        _schema.read_schema("guid STRING")
    with pytest.raises(TypeError, match="must start with"):
        _schema.check_read_schema(StructType([StructField("value", StringType())]))


# ---- stream reader: offsets, replay, commit -------------------------------------------------


def payloads(messages: List[FakeMessage]) -> List[bytes]:
    return [m.data for m in messages]


def data(rows: List[tuple]) -> List[bytes]:
    return [row[0] for row in rows]


def names(first: int, end: int) -> List[bytes]:
    return [f"m{i}".encode() for i in range(first, end)]


def test_stream_reader_batches_replays_and_confirms_finished_batches(consumer: FakeConsumer) -> None:
    reader = stream_reader(per_batch=10)
    start = reader.initialOffset()
    rows1, end1 = take(reader, start)
    assert data(rows1) == names(0, 10)
    assert rows1[0][1:4] == ({"n": "0"}, bytes(16).hex().upper(), QUEUE)
    assert consumer.confirmed == []
    # Two partitions, cut the same way each time: Spark may ask for a range again.
    assert len(reader.partitions(start, end1)) == 2
    assert replay(reader, start, end1) == rows1
    reader.commit(end1)
    assert payloads(consumer.confirmed) == names(0, 10)
    rows2, end2 = take(reader, end1)
    assert data(rows2) == names(10, 20)
    assert replay(reader, end1, end2) == rows2
    assert len(consumer.confirmed) == 10
    # Spark asks for the next batch only once this one has ended: asking confirms it, even
    # without a commit (Spark commits a batch only when it plans the next one with data).
    rows3, end3 = take(reader, end2)
    assert len(consumer.confirmed) == 20 and data(rows3) == names(20, 25)
    reader.commit(end2)  # a late commit confirms nothing twice
    assert len(consumer.confirmed) == 20
    # An empty queue gives back the start offset: Spark plans no batch.
    end4 = reader.latestOffset(end3, ReadAllAvailable())
    assert end4 == end3 and reader.partitions(end3, end4) == []
    assert payloads(consumer.confirmed) == names(0, 25)
    reader.stop()


def test_a_batch_spark_waits_for_is_cut_small_so_the_next_is_taken_meanwhile(consumer: FakeConsumer) -> None:
    consumer.waiting = [FakeMessage(i) for i in range(20_000)]
    reader = stream_reader(per_batch=16_000)
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadAllAvailable())
    assert first["seq"] == 2_000  # an eighth: nothing was prefetched, Spark waits for it
    second = reader.latestOffset(first, ReadAllAvailable())
    assert second["seq"] == 18_000  # prefetched while Spark ran the first: a whole batch
    assert data(replay(reader, first, second)) == names(2_000, 18_000)
    third = reader.latestOffset(second, ReadAllAvailable())
    assert third["seq"] == 20_000
    reader.stop()


def test_stream_reader_partitions_split_a_batch(consumer: FakeConsumer) -> None:
    reader = stream_reader(per_batch=25, partitions=3)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    sizes = [len(rows_of(reader.read(part))) for part in parts]
    assert sizes == [9, 8, 8]
    rows = replay(reader, start, end)
    assert data(rows) == names(0, 25)
    # Each slice's rows are completed in the executor from its own packed rows: every GUID
    # stays with its payload (the later slices start inside the batch's GUID buffer).
    assert [row[2] for row in rows] == [i.to_bytes(16, "big").hex().upper() for i in range(25)]
    assert {row[3] for row in rows} == {QUEUE}
    reader.stop()


def test_stream_reader_prefetch_waits_for_messages_until_spark_asks(consumer: FakeConsumer) -> None:
    reader = stream_reader(per_batch=30)
    rows, offset = take(reader, reader.initialOffset())
    assert data(rows) == names(0, 25)  # emptied the queue; the next batch is prefetched meanwhile
    polls = consumer.empty_polls
    consumer.wait_for_empty_polls(polls + 2)  # the prefetch saw gaps and kept waiting ...
    consumer.deliver(FakeMessage(99))
    rows, offset = take(reader, offset)  # ... so the message that came later is in the batch
    assert data(rows) == [b"m99"]
    reader.stop()


def test_stream_reader_available_now_stops_at_the_first_read_that_gets_nothing(consumer: FakeConsumer) -> None:
    SupportsTriggerAvailableNow = pytest.importorskip("pyspark.sql.streaming.datasource",
                                                      reason="pyspark>=4.2").SupportsTriggerAvailableNow
    reader = stream_reader(per_batch=10)
    assert isinstance(reader, SupportsTriggerAvailableNow)
    reader.prepareForTriggerAvailableNow()
    offset = reader.initialOffset()
    sizes = []
    for _ in range(3):
        rows, offset = take(reader, offset)
        sizes.append(len(rows))
    assert sizes == [10, 10, 5]
    # Emptying the local inbox is not the end: the broker may still be delivering (flow control).
    consumer.deliver(FakeMessage(98))
    rows, offset = take(reader, offset)
    assert data(rows) == [b"m98"]
    end = reader.latestOffset(offset, ReadAllAvailable())  # nothing came within pollTimeout ...
    assert end == offset  # ... so Spark ends the run ...
    assert len(consumer.confirmed) == 26  # ... with every batch confirmed
    consumer.deliver(FakeMessage(99))  # arrived after the run caught up with the queue
    assert reader.latestOffset(offset, ReadAllAvailable()) == offset
    assert payloads(consumer.waiting) == [b"m99"]
    reader.stop()


def test_stream_reader_available_now_waits_for_a_backlog_the_broker_is_slow_to_deliver(
        consumer: FakeConsumer) -> None:
    consumer.undelivered, consumer.waiting = consumer.waiting, []  # the broker has not started yet
    reader = stream_reader(per_batch=30)
    reader.prepareForTriggerAvailableNow()
    # Silence for a few pollTimeouts while the broker holds 25 messages for the reader ...
    releaser = threading.Thread(target=lambda: (consumer.wait_for_empty_polls(3), consumer.release()))
    releaser.start()
    rows, offset = take(reader, reader.initialOffset())
    releaser.join()
    assert data(rows) == names(0, 25)  # ... is no end: the backlog came in the run's first batch
    assert reader.latestOffset(offset, ReadAllAvailable()) == offset  # then the run has caught up
    assert len(consumer.confirmed) == 25
    reader.stop()


def test_stream_reader_available_now_ends_when_the_broker_holds_nothing_more(consumer: FakeConsumer) -> None:
    reader = stream_reader(per_batch=30)
    reader.prepareForTriggerAvailableNow()  # the broker holds 25 ...
    consumer.confirm_many([consumer.waiting.pop(0) for _ in range(5)])  # ... another consumer takes 5
    rows, offset = take(reader, reader.initialOffset())
    assert len(rows) == 20
    assert reader.latestOffset(offset, ReadAllAvailable()) == offset  # fewer than 25 received, none held
    assert consumer.held_asked == 2  # when the run started, then once: no waiting on
    reader.stop()


def test_stream_reader_available_now_gives_up_on_messages_it_is_never_delivered(
        consumer: FakeConsumer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_stream, "_UNDELIVERED_PATIENCE", 0.5)
    consumer.undelivered, consumer.waiting = consumer.waiting, []  # held by another consumer, forever
    reader = stream_reader()
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    with caplog.at_level("WARNING", logger="bmq.spark._stream"):
        assert reader.latestOffset(start, ReadAllAvailable()) == start
    assert consumer.empty_polls >= 2
    assert "the broker holds 25 messages but delivered none" in caplog.text
    reader.stop()


def test_stream_reader_available_now_takes_silence_for_the_end_when_the_broker_cannot_tell(
        consumer: FakeConsumer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_session, "held_messages", lambda options: None)
    consumer.undelivered, consumer.waiting = consumer.waiting, []
    reader = stream_reader()
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    assert consumer.empty_polls == 1
    reader.stop()


def test_held_messages_counts_the_readers_app_and_cannot_tell_for_a_subscription(broker_address: str) -> None:
    with bmq.Session(broker_address) as session:
        session.open_queue(QUEUE + "-held", write=True).post_many([b"a", b"b", b"c"])
    options = StreamOptions.parse({"broker": broker_address, "queue": QUEUE + "-held"})
    assert _session.held_messages(options) == 3
    subscribed = StreamOptions.parse({"broker": broker_address, "queue": QUEUE + "-held", "subscription": "x > 1"})
    assert _session.held_messages(subscribed) is None
    with bmq.Session(broker_address) as session:
        queue = session.open_queue(QUEUE + "-held", read=True)
        session.confirm_many([queue.get(timeout=30) for _ in range(3)])
    assert _session.held_messages(options) == 0


def test_stream_reader_without_available_now_keeps_reading(consumer: FakeConsumer) -> None:
    reader = stream_reader(per_batch=30)
    rows, offset = take(reader, reader.initialOffset())
    assert len(rows) == 25  # emptied the queue
    assert reader.latestOffset(offset, ReadAllAvailable()) == offset
    consumer.deliver(FakeMessage(99))
    rows, _ = take(reader, offset)
    assert data(rows) == [b"m99"]
    reader.stop()


def test_stream_reader_ignores_offsets_of_an_earlier_run(consumer: FakeConsumer) -> None:
    old = stream_reader()
    old_start = old.initialOffset()
    _, old_end = take(old, old_start)
    old.stop()  # the driver died: the broker redelivers what the old session had not confirmed
    restarted = stream_reader()
    # The uncommitted batch of the earlier run is not replayed (the broker redelivers it) ...
    assert restarted.partitions(old_start, old_end) == []
    restarted.commit(old_end)
    assert consumer.confirmed == []
    # ... and reading continues from the earlier run's end offset, with the redelivered messages.
    rows, end = take(restarted, old_end)
    assert data(rows) == names(0, 10) and end["run"] != old_end["run"]
    restarted.stop()


def test_a_pickled_stream_reader_is_a_fresh_reader(consumer: FakeConsumer) -> None:
    reader = stream_reader()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.partitions(start, end) == []
    assert copy.initialOffset()["run"] != start["run"]
    reader.stop()


def test_stream_reader_refuses_to_skip_an_uncommitted_batch(consumer: FakeConsumer) -> None:
    reader = stream_reader()
    start = reader.initialOffset()
    reader.latestOffset(start, ReadAllAvailable())
    with pytest.raises(RuntimeError, match="seq"):
        reader.latestOffset(start, ReadAllAvailable())
    reader.stop()


def test_stream_reader_stop_closes_the_session_and_ends_the_prefetch(consumer: FakeConsumer) -> None:
    reader = stream_reader()
    reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    reader.stop()  # returns only once the prefetch has ended
    assert consumer.closed and consumer.confirmed == []
    assert payloads(consumer.waiting) == names(0, 25)  # all of it goes back for redelivery


# ---- batch reader -------------------------------------------------------------------------


def test_batch_reader_splits_and_confirms_after_the_last_batch(consumer: FakeConsumer) -> None:
    options = ReadOptions.parse({"queue": QUEUE, "maxMessages": "21", "numPartitions": "2", "idleTimeout": "0.1"})
    reader = BlazingMQReader(options, read_struct())
    partitions = reader.partitions()
    assert [p.value for p in partitions] == [11, 10]
    batches = reader.read(partitions[0])
    rows = rows_of([next(batches)])
    assert data(rows) == names(0, 11)
    assert consumer.confirmed == []  # not before Spark has taken the last batch
    assert list(batches) == []
    assert payloads(consumer.confirmed) == names(0, 11)
    assert consumer.closed


def test_batch_reader_without_confirm_leaves_messages(consumer: FakeConsumer) -> None:
    options = ReadOptions.parse({"queue": QUEUE, "maxMessages": "100", "confirm": "false", "idleTimeout": "0.1"})
    reader = BlazingMQReader(options, read_struct())
    assert len(rows_of(reader.read(reader.partitions()[0]))) == 25
    assert consumer.confirmed == []


def test_data_source_name_and_schema() -> None:
    source = BlazingMQDataSource({"queue": QUEUE, "propertySchema": "n INT"})
    assert BlazingMQDataSource.name() == "blazingmq"
    assert source.schema().endswith("received timestamp, n INT")
