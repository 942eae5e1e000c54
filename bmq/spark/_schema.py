"""Spark schemas <-> BlazingMQ messages: the column contract of the ``blazingmq`` source.

Write side: which input columns become the payload and the properties, checked against the
DataFrame's schema on the driver (so a wrong type fails before any data is sent), then applied
to Arrow record batches in the executors. Read side: the output schema and the conversion of
received :class:`bmq.MessageBatch` objects into Arrow record batches.
"""
from __future__ import annotations

import array
import dataclasses
import datetime
import itertools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import bmq

__all__ = [
    "DATA_COLUMN",
    "PROPERTIES_COLUMN",
    "READ_FIELDS",
    "WriteLayout",
    "read_schema",
    "check_read_schema",
    "RowBuilder",
]

DATA_COLUMN = "data"
PROPERTIES_COLUMN = "properties"

# Spark type (by class) -> property type on the wire (protocol §6.2). ByteType is a signed
# 8-bit integer, exactly the range of CHAR.
_PROPERTY_TYPES: Dict[type, int] = {
    BooleanType: bmq.PropertyType.BOOL,
    ByteType: bmq.PropertyType.CHAR,
    ShortType: bmq.PropertyType.SHORT,
    IntegerType: bmq.PropertyType.INT32,
    LongType: bmq.PropertyType.INT64,
    StringType: bmq.PropertyType.STRING,
    BinaryType: bmq.PropertyType.BINARY,
}
_SUPPORTED = "boolean, byte, short, int, bigint, string or binary"


def _property_type(where: str, data_type: DataType) -> int:
    kind = _PROPERTY_TYPES.get(type(data_type))
    if kind is None:
        raise TypeError(f"blazingmq: {where} has type {data_type.simpleString()}; a property must be {_SUPPORTED}")
    return kind


@dataclasses.dataclass(frozen=True)
class WriteLayout:
    """Where the payload and the properties of each message come from.

    Attributes:
        data_is_string: the ``data`` column is a string (sent UTF-8 encoded), else binary.
        map_type: property type of every value of a ``properties`` map column, or None.
        struct_types: ``(field, type)`` of a ``properties`` struct column (empty if none).
        column_types: ``(column, type)`` of the columns promoted to properties.
        guid_column: the column keying deterministic GUIDs, or None.
    """

    data_is_string: bool
    map_type: Optional[int]
    struct_types: Tuple[Tuple[str, int], ...]
    column_types: Tuple[Tuple[str, int], ...]
    guid_column: Optional[str]

    @classmethod
    def of(cls, schema: StructType, property_columns: Sequence[str], guid_column: Optional[str]) -> "WriteLayout":
        """Check ``schema`` for a writable DataFrame and say how to map it.

        Raises:
            TypeError: a missing ``data`` column or a column of an unsupported type.
        """
        fields = {field.name: field for field in schema.fields}
        data = fields.get(DATA_COLUMN)
        if data is None:
            raise TypeError(
                f"blazingmq: the DataFrame needs a '{DATA_COLUMN}' column (binary or string) for the payload; "
                f"it has {schema.simpleString()}"
            )
        if not isinstance(data.dataType, (BinaryType, StringType)):
            raise TypeError(
                f"blazingmq: column '{DATA_COLUMN}' must be binary or string, not {data.dataType.simpleString()}"
            )
        map_type = None
        struct_types: Tuple[Tuple[str, int], ...] = ()
        props = fields.get(PROPERTIES_COLUMN)
        if props is not None:
            kind = props.dataType
            if isinstance(kind, MapType):
                if not isinstance(kind.keyType, StringType):
                    raise TypeError(
                        f"blazingmq: the '{PROPERTIES_COLUMN}' map must have string keys, not {kind.simpleString()}"
                    )
                map_type = _property_type(f"'{PROPERTIES_COLUMN}' map value", kind.valueType)
            elif isinstance(kind, StructType):
                struct_types = tuple(
                    (f.name, _property_type(f"'{PROPERTIES_COLUMN}.{f.name}'", f.dataType)) for f in kind.fields
                )
            else:
                raise TypeError(
                    f"blazingmq: column '{PROPERTIES_COLUMN}' must be a map<string, ...> or a struct, "
                    f"not {kind.simpleString()}"
                )
        column_types = []
        for name in property_columns:
            field = fields.get(name)
            if field is None:
                raise TypeError(f"blazingmq: propertyColumns names '{name}', which the DataFrame does not have")
            column_types.append((name, _property_type(f"property column '{name}'", field.dataType)))
        if guid_column is not None:
            field = fields.get(guid_column)
            if field is None or not isinstance(field.dataType, (StringType, BinaryType)):
                raise TypeError(
                    f"blazingmq: guidColumn '{guid_column}' must be a string or binary column of the DataFrame"
                )
        return cls(isinstance(data.dataType, StringType), map_type, struct_types, tuple(column_types), guid_column)

    @property
    def has_properties(self) -> bool:
        """True when some column feeds message properties."""
        return self.map_type is not None or bool(self.struct_types) or bool(self.column_types)

    def payloads(self, batch: Any) -> Sequence[bytes]:
        """The payloads of an Arrow record batch, as bytes (a string's UTF-8 encoding)."""
        column = batch.column(DATA_COLUMN)
        if column.null_count:
            raise ValueError(f"blazingmq: column '{DATA_COLUMN}' holds a null; every message needs a payload")
        return _bytes_values(column)

    def properties(self, batch: Any) -> Optional[List[Optional[Dict[str, Tuple[int, Any]]]]]:
        """One ``{name: (type, value)}`` per row (None where it has none), or None for no properties.

        Null values are left out: BlazingMQ has no null property.
        """
        if not self.has_properties:
            return None
        rows: List[Dict[str, Tuple[int, Any]]] = [{} for _ in range(batch.num_rows)]
        if self.map_type is not None:
            kind = self.map_type
            for row, entries in zip(rows, batch.column(PROPERTIES_COLUMN).to_pylist()):
                for name, value in entries or ():
                    if value is not None:
                        row[name] = (kind, value)
        if self.struct_types:
            for row, struct in zip(rows, batch.column(PROPERTIES_COLUMN).to_pylist()):
                if struct is not None:
                    _add(row, self.struct_types, struct.get)
        for name, kind in self.column_types:
            for row, value in zip(rows, batch.column(name).to_pylist()):
                if value is not None:
                    row[name] = (kind, value)
        return [row or None for row in rows]

    def guid_keys(self, batch: Any) -> Optional[Sequence[bytes]]:
        """The per-row GUID keys from ``guid_column``, or None when GUIDs follow row positions.

        Raises:
            ValueError: a null key (it could not be de-duplicated).
        """
        if self.guid_column is None:
            return None
        column = batch.column(self.guid_column)
        if column.null_count:
            raise ValueError(f"blazingmq: guidColumn '{self.guid_column}' holds a null")
        return _bytes_values(column)


# Arrow binary/string types -> the width of their offsets.
_OFFSET_SIZES = {pa.binary(): 4, pa.string(): 4, pa.large_binary(): 8, pa.large_string(): 8}


def _bytes_values(column: Any) -> Sequence[bytes]:
    """The values of a binary or string Arrow column without nulls, as bytes (a string's UTF-8
    encoding): a :class:`bmq._codec.PayloadColumn` over its offsets and data buffers (no Python
    object per value, which ``post_many`` copies straight into its PUT events)."""
    offset_size = _OFFSET_SIZES.get(column.type)
    if offset_size is None:  # another layout (a view type): value by value
        return [value.encode() if isinstance(value, str) else value for value in column.to_pylist()]
    if not len(column):
        return []
    _, offsets, data = column.buffers()
    return bmq._codec.PayloadColumn(offsets, b"" if data is None else data, column.offset, len(column), offset_size)


def _add(row: Dict[str, Tuple[int, Any]], types: Sequence[Tuple[str, int]], get: Callable[[str], Any]) -> None:
    for name, kind in types:
        value = get(name)
        if value is not None:
            row[name] = (kind, value)


# ---- read side ------------------------------------------------------------------------

READ_FIELDS = (
    StructField(DATA_COLUMN, BinaryType(), False),
    StructField(PROPERTIES_COLUMN, MapType(StringType(), StringType(), False), False),
    StructField("guid", StringType(), False),
    StructField("queue", StringType(), False),
    StructField("received", TimestampType(), False),
)
_RESERVED = {field.name for field in READ_FIELDS}
_GUID_SIZE = 16
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def read_schema(property_schema: str) -> str:
    """The DDL of the rows a read returns: the fixed columns, then ``property_schema``'s.

    ``property_schema`` is a DDL list (``"count INT, tag STRING"``) of properties to return as
    typed columns besides the string map; Spark parses and validates it.

    Raises:
        ValueError: a typed column reuses a fixed column's name.
    """
    base = ", ".join(f"{field.name} {field.dataType.simpleString()}" for field in READ_FIELDS)
    if not property_schema.strip():
        return base
    for part in property_schema.split(","):
        name = part.strip().split(" ", 1)[0].strip("`")
        if name in _RESERVED:
            raise ValueError(f"blazingmq: propertySchema column '{name}' clashes with a fixed column of the source")
    return f"{base}, {property_schema}"


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    return str(value)


def _typed(data_type: DataType) -> Callable[[Any], Any]:
    """A converter of a property value to ``data_type``, giving None where it does not fit."""
    if isinstance(data_type, StringType):
        return _as_text
    if isinstance(data_type, BinaryType):
        return lambda value: value.encode() if isinstance(value, str) else bytes(value)
    if isinstance(data_type, BooleanType):
        return lambda value: value if isinstance(value, bool) else None
    bits = _INTEGER_BITS.get(type(data_type))
    if bits is not None:
        return _int_in_range(bits)
    raise TypeError(f"blazingmq: propertySchema column of type {data_type.simpleString()}; use {_SUPPORTED}")


# Width of each integral Spark type: a value outside it must become null, as Arrow would
# otherwise fail the whole read (and a stream would be stuck on that message forever).
_INTEGER_BITS: Dict[type, int] = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}


def _as_int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, bytes) and len(value) == 1:  # CHAR
        return int.from_bytes(value, "big", signed=True)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _int_in_range(bits: int) -> Callable[[Any], Optional[int]]:
    """A converter to a signed ``bits``-bit integer, None where the value is no integer or too wide."""
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def convert(value: Any) -> Optional[int]:
        number = _as_int(value)
        return number if number is not None and low <= number <= high else None

    return convert


def check_read_schema(schema: StructType) -> None:
    """Check that a user-given read schema starts with the source's fixed columns.

    Raises:
        TypeError: the schema does not start with data, properties, guid, queue, received.
    """
    names = [field.name for field in schema.fields[: len(READ_FIELDS)]]
    expected = [field.name for field in READ_FIELDS]
    if names != expected:
        raise TypeError(
            f"blazingmq: a read schema must start with the columns {', '.join(expected)} "
            f"(then typed property columns); got {schema.simpleString()}"
        )
    for field in schema.fields[len(READ_FIELDS):]:
        _typed(field.dataType)


# The columns below are built from whole buffers rather than with ``pa.array``/``pa.scalar``
# on Python lists: that is faster, needs no growing buffers (which cost several times the data
# in memory), and avoids pyarrow's first conversion importing pandas (0.3-2 s of a query's
# first micro-batch).


def _text_map(all_properties: Optional[Sequence[Dict[str, Any]]], count: int, map_type: pa.MapType) -> pa.MapArray:
    """The ``properties`` column: each message's properties as text (see :func:`_as_text`);
    all empty when ``all_properties`` is None (most streams have no properties at all)."""
    ends = array.array("i", [0]) * (count + 1)
    names: List[bytes] = []
    texts: List[bytes] = []
    for index, properties in enumerate(all_properties or (), start=1):
        for name, value in properties.items():
            names.append(name.encode())
            texts.append(_as_text(value).encode())
        ends[index] = len(names)
    entries = pa.Array.from_buffers(
        pa.struct([map_type.key_field, map_type.item_field]),
        len(names),
        [None],
        children=[_variable(names, pa.string()), _variable(texts, pa.string())],
    )
    return pa.Array.from_buffers(map_type, count, [None, pa.py_buffer(ends)], children=[entries])


def _fixed_width(text: bytes, width: int, count: int) -> pa.StringArray:
    """``count`` strings of ``width`` encoded bytes each, back to back in ``text``."""
    ends = array.array("i", range(0, width * count + 1, width))
    return pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(ends), pa.py_buffer(text)])


def _variable(values: List[bytes], kind: pa.DataType) -> pa.Array:
    """``values`` (encoded text for a string ``kind``) as a binary or string column."""
    ends = array.array("i", [0])
    ends.extend(itertools.accumulate(map(len, values)))
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(ends), pa.py_buffer(b"".join(values))])


def _repeated_timestamp(moment: datetime.datetime, kind: pa.TimestampType, count: int) -> pa.TimestampArray:
    micros = (moment - _EPOCH) // datetime.timedelta(microseconds=1)
    return pa.Array.from_buffers(kind, count, [None, pa.py_buffer(array.array("q", [micros]) * count)])


def arrow_schema(schema: StructType) -> pa.Schema:
    """Spark's Arrow schema of ``schema``, timestamps in UTC (pyspark 4.2 and later name the
    zone, 4.1 has a flag for UTC)."""
    try:
        return to_arrow_schema(schema, timezone="UTC")
    except TypeError:  # pyspark 4.1: to_arrow_schema(schema, timestamp_utc=True)
        return to_arrow_schema(schema, timestamp_utc=True)  # type: ignore[call-arg]


class RowBuilder:
    """Turns received :class:`bmq.MessageBatch` objects into the rows of the output ``schema``.

    A row holds the payload, the properties as text (see :func:`_as_text`), the GUID in hex,
    the queue URI, ``received`` and the typed property columns (null where a value does not
    fit), built column by column from the batch's buffers: Spark takes Arrow batches as they
    are, while row tuples cost it a Python conversion per value. The Arrow schema is the one
    Spark derives from ``schema`` (and checks batches against).

    The work comes in two halves so that a stream's driver, which must hold the session (it
    confirms), does the least of it: :meth:`pack` keeps what only the messages can give (the
    payloads wrapped without a copy, the GUIDs as 16 raw bytes, the properties), and
    :meth:`unpack`, in the executors, adds what follows from it (the GUIDs in hex, the queue
    and ``received`` columns, repeated on every row). The packed rows are about a quarter of
    the full ones for small payloads, which is what the driver serialises and Spark ships.

    Raises:
        TypeError: a typed property column of an unsupported type.
    """

    def __init__(self, schema: StructType):
        self.arrow_schema = arrow_schema(schema)
        self._extra = [(field.name, _typed(field.dataType)) for field in schema.fields[len(READ_FIELDS):]]
        self._map_type = self.arrow_schema.field(PROPERTIES_COLUMN).type
        self._received_type = self.arrow_schema.field("received").type

    def __call__(self, messages: bmq.MessageBatch, received: datetime.datetime) -> pa.RecordBatch:
        """The full rows of ``messages``, received at ``received``."""
        return self.unpack(self.pack(messages), messages.queue_uri, received)

    def pack(self, messages: bmq.MessageBatch) -> pa.RecordBatch:
        """``messages`` as packed rows: the payload, the 16-byte GUID, the properties map and
        the typed property columns."""
        count = len(messages)
        all_properties = messages.all_properties() if messages.has_properties else None
        columns = [
            pa.Array.from_buffers(
                pa.binary(), count, [None, pa.py_buffer(messages.offsets), pa.py_buffer(messages.payloads)]
            ),
            pa.Array.from_buffers(pa.binary(_GUID_SIZE), count, [None, pa.py_buffer(messages.guids)]),
            _text_map(all_properties, count, self._map_type),
        ]
        for index, (name, convert) in enumerate(self._extra, start=len(READ_FIELDS)):
            if all_properties is None:
                typed: List[Any] = [None] * count
            else:
                values = [properties.get(name) for properties in all_properties]
                typed = [None if value is None else convert(value) for value in values]
            columns.append(pa.array(typed, self.arrow_schema.field(index).type))
        return pa.RecordBatch.from_arrays(columns, names=[f"_{index}" for index in range(len(columns))])

    def unpack(self, packed: pa.RecordBatch, queue_uri: str, received: datetime.datetime) -> pa.RecordBatch:
        """The full rows of ``packed`` (from :meth:`pack`): every message from ``queue_uri``
        (a reader consumes one queue), received at ``received``."""
        count = packed.num_rows
        guids = packed.column(1)
        raw = memoryview(guids.buffers()[1])[guids.offset * _GUID_SIZE:(guids.offset + count) * _GUID_SIZE]
        uri = queue_uri.encode()
        columns = [
            packed.column(0),
            packed.column(2),
            _fixed_width(raw.hex().upper().encode(), 2 * _GUID_SIZE, count),  # GUIDs in hex
            _fixed_width(uri * count, len(uri), count),
            _repeated_timestamp(received, self._received_type, count),
            *packed.columns[3:],
        ]
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)
