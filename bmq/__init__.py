"""bmq: a fast, dependable synchronous Python client for BlazingMQ.

::

    import bmq

    with bmq.Session("tcp://localhost:30114") as session:
        queue = session.open_queue("bmq://bmq.test.mem.priority/orders", read=True, write=True)
        ack = queue.post(b"payload", properties={"kind": "new"})   # blocks until the ACK
        message = queue.get(timeout=5.0)                           # None after 5 s of silence
        message.confirm()

Blocking calls are ``*_async().result()`` on :class:`concurrent.futures.Future` objects, and
every blocking call has a timeout. Callbacks (``on_message``, ``on_ack``, ``on_event``) run on
the session's dispatcher thread and may call any session method.

Reliability: a lost connection is re-established (:class:`ReconnectPolicy`), queues are
reopened and unacknowledged posts re-sent with their original GUIDs, so the broker keeps each
message once. ``SessionOptions(outbox_dir=...)`` also keeps unacknowledged posts on disk
(zstd-compressed segments) for the next process; they survive a killed process, and with the
default ``outbox_fsync="batch"`` a power loss too, at the cost of one disk flush per post call.
Confirms are never buffered: while reconnecting they are dropped and the broker redelivers.
"""
import logging

try:
    from . import _codec  # noqa: F401  (compiled: first, so a source tree fails with advice)
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    import os as _os

    _here = _os.path.dirname(_os.path.abspath(__file__))
    if not _os.path.exists(_os.path.join(_here, "_codec.pyx")):
        raise
    raise ImportError(
        f"bmq's compiled wire codec (bmq._codec) is missing: Python is importing the bmq source tree at "
        f"{_here}, which is not built. Either install bmq (`pip install .`) and run from another directory "
        f"than the source checkout, or build it in place (`pip install -e .` or "
        f"`python setup.py build_ext --inplace`)."
    ) from exc

from . import events, exceptions
from ._codec import MAX_PAYLOAD_SIZE, deterministic_guid
from ._health import HostHealthMonitor, ManualHostHealthMonitor
from . import _admin
from ._admin import (
    Admin, AppStats, BrokerQueueStats, ClusterInfo, ClusterNode, ClusterStatus, DomainInfo, PartitionStatus, PurgeResult,
)
from ._options import QueueOptions, ReconnectPolicy, SessionOptions, Subscription
from ._queue import Queue
from ._session import Session
from ._stats import QueueStats, SessionStats
from ._tls import client_context as tls_context
from ._uri import QueueUri, parse_uri
from ._version import __version__
from ._types import (
    Ack,
    AckStatus,
    CompressionAlgorithmType,
    Message,
    MessageBatch,
    PropertyType,
    QueueState,
    SessionState,
)
from .exceptions import *  # noqa: F401,F403

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "Session",
    "Queue",
    "Message",
    "MessageBatch",
    "Ack",
    "AckStatus",
    "PropertyType",
    "QueueState",
    "SessionState",
    "CompressionAlgorithmType",
    "SessionOptions",
    "QueueOptions",
    "Subscription",
    "ReconnectPolicy",
    "tls_context",
    "HostHealthMonitor",
    "ManualHostHealthMonitor",
    "QueueUri",
    "parse_uri",
    "deterministic_guid",
    "MAX_PAYLOAD_SIZE",
    "SessionStats",
    "QueueStats",
    *_admin.__all__,
    "events",
    "exceptions",
    "__version__",
    *exceptions.__all__,
]
