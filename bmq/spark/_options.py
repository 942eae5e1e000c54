"""Spark option strings -> validated, typed settings of the ``blazingmq`` data source.

Spark hands every option over as a string in a case-insensitive mapping; each setting is
parsed once, on the driver, so that a typo fails the query before any data moves.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional, Tuple, TypeVar

import bmq

__all__ = ["DEFAULT_BROKER", "CommonOptions", "WriteOptions", "ReadOptions", "StreamOptions"]

DEFAULT_BROKER = "tcp://localhost:30114"

_T = TypeVar("_T")
_MIB = 1024 * 1024
# Spark spends a fixed ~0.1-0.3 s planning and committing each micro-batch, so a backlog drains
# fast only in large batches; the byte bound keeps a batch's memory in check (the driver holds
# two batches: their messages and their Arrow copies).
_MAX_MESSAGES_PER_BATCH = 200_000
_MAX_BYTES_PER_BATCH = 32 * _MIB


def _get(options: Mapping[str, str], name: str, parse: Callable[[str], _T], default: _T) -> _T:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        return parse(str(raw).strip())
    except ValueError as e:
        raise ValueError(f"blazingmq option {name!r}: {e}") from None


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"must be a positive integer, not {text!r}")
    return value


def _batch_bytes(text: str) -> int:
    # A micro-batch's payloads become one Arrow binary column, whose offsets are 32-bit.
    value = _positive_int(text)
    if value > 1024 * _MIB:
        raise ValueError(f"must be at most 1 GiB ({1024 * _MIB}), not {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be a positive number of seconds, not {text!r}")
    return value


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"must be true or false, not {text!r}")


def _names(text: str) -> Tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(","))
    if any(not name for name in names):
        raise ValueError(f"must be comma-separated column names, not {text!r}")
    return names


def _subscription(options: Mapping[str, str]) -> str:
    """The ``subscription`` option: a subscription expression ("" = every message), checked
    here on the driver as the client checks it (syntax, limits, types)."""
    raw = options.get("subscription")
    if raw is None or not str(raw).strip():
        return ""
    try:
        return bmq.Subscription(str(raw)).expression
    except bmq.InvalidArgumentError as e:
        raise bmq.InvalidArgumentError(f"blazingmq option 'subscription': {e}") from None


def _queue(options: Mapping[str, str]) -> str:
    uri = options.get("queue")
    if not uri:
        raise ValueError(
            "blazingmq: the 'queue' option is required, e.g. .option('queue', 'bmq://bmq.test.mem.priority/q')"
        )
    bmq.parse_uri(uri)  # raises bmq.InvalidURIError naming the faulty part
    return uri


@dataclasses.dataclass(frozen=True)
class CommonOptions:
    """Settings shared by every direction.

    Attributes:
        broker: ``tcp://host:port`` of the broker, or several comma-separated that the
            sessions fail over between (option ``broker``).
        queue: the queue URI (option ``queue``, required).
        connect_timeout: seconds to connect and negotiate (option ``connectTimeout``).

    Thread-safety: immutable.
    """

    broker: str
    queue: str
    connect_timeout: float

    @staticmethod
    def _common(options: Mapping[str, str]) -> dict:
        return {
            "broker": options.get("broker") or DEFAULT_BROKER,
            "queue": _queue(options),
            "connect_timeout": _get(options, "connectTimeout", _positive_float, 10.0),
        }


@dataclasses.dataclass(frozen=True)
class WriteOptions(CommonOptions):
    """Settings of the batch and streaming writers.

    Attributes:
        property_columns: columns promoted to message properties (option ``propertyColumns``).
        guid_column: a column whose value (with the queue URI) keys each message's GUID
            instead of its position (option ``guidColumn``), e.g. ``guid`` when copying
            between queues, so that a redelivered source message is de-duplicated downstream.
        ack_timeout: seconds to wait for the broker's ACKs of one task (option ``ackTimeout``).
    """

    property_columns: Tuple[str, ...] = ()
    guid_column: Optional[str] = None
    ack_timeout: float = 120.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "WriteOptions":
        """Validated settings from Spark's options.

        Raises:
            ValueError: a missing or malformed option (bmq.InvalidURIError for the queue).
        """
        return cls(
            **cls._common(options),
            property_columns=_get(options, "propertyColumns", _names, ()),
            guid_column=options.get("guidColumn") or None,
            ack_timeout=_get(options, "ackTimeout", _positive_float, 120.0),
        )


@dataclasses.dataclass(frozen=True)
class ReadOptions(CommonOptions):
    """Settings of the batch reader (``spark.read``).

    Attributes:
        max_messages: stop after this many messages in all (option ``maxMessages``).
        idle_timeout: stop when no message came for this many seconds (option ``idleTimeout``).
        num_partitions: consuming sessions (Spark tasks) sharing the drain (``numPartitions``).
        confirm: confirm what was read (option ``confirm``); false leaves the queue as it was.
        property_schema: DDL of typed property columns (option ``propertySchema``).
        subscription: read only the messages whose properties satisfy this expression
            (option ``subscription``, e.g. ``region == "EU" && qty > 10``); the others stay
            in the queue. Empty: every message.
    """

    max_messages: int = 10_000
    idle_timeout: float = 2.0
    num_partitions: int = 1
    confirm: bool = True
    property_schema: str = ""
    subscription: str = ""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "ReadOptions":
        """Validated settings from Spark's options.

        Raises:
            ValueError: a missing or malformed option (bmq.InvalidArgumentError naming the
                expression, offset and reason for ``subscription``).
        """
        return cls(
            **cls._common(options),
            max_messages=_get(options, "maxMessages", _positive_int, 10_000),
            idle_timeout=_get(options, "idleTimeout", _positive_float, 2.0),
            num_partitions=_get(options, "numPartitions", _positive_int, 1),
            confirm=_get(options, "confirm", _bool, True),
            property_schema=options.get("propertySchema") or "",
            subscription=_subscription(options),
        )


@dataclasses.dataclass(frozen=True)
class StreamOptions(CommonOptions):
    """Settings of the streaming reader (``spark.readStream``).

    Attributes:
        max_messages_per_batch: messages per micro-batch at most (``maxMessagesPerBatch``).
        max_bytes_per_batch: payload bytes per micro-batch at most, except that a batch
            always takes at least one message (``maxBytesPerBatch``).
        poll_timeout: seconds a micro-batch waits for its first message (``pollTimeout``).
        num_partitions: Spark partitions (tasks) each micro-batch is split into
            (``numPartitions``), so that several cores take it in parallel.
        property_schema: DDL of typed property columns (option ``propertySchema``).
        subscription: stream only the messages whose properties satisfy this expression
            (option ``subscription``); the others stay in the queue. Empty: every message.
    """

    max_messages_per_batch: int = _MAX_MESSAGES_PER_BATCH
    max_bytes_per_batch: int = _MAX_BYTES_PER_BATCH
    poll_timeout: float = 0.5
    num_partitions: int = 2
    property_schema: str = ""
    subscription: str = ""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "StreamOptions":
        """Validated settings from Spark's options.

        Raises:
            ValueError: a missing or malformed option.
        """
        return cls(
            **cls._common(options),
            max_messages_per_batch=_get(options, "maxMessagesPerBatch", _positive_int, _MAX_MESSAGES_PER_BATCH),
            max_bytes_per_batch=_get(options, "maxBytesPerBatch", _batch_bytes, _MAX_BYTES_PER_BATCH),
            poll_timeout=_get(options, "pollTimeout", _positive_float, 0.5),
            num_partitions=_get(options, "numPartitions", _positive_int, 2),
            property_schema=options.get("propertySchema") or "",
            subscription=_subscription(options),
        )
