"""bmq: a fast, dependable synchronous Python client for BlazingMQ."""
import logging

from . import events, exceptions
from ._health import HostHealthMonitor, ManualHostHealthMonitor
from ._options import QueueOptions, ReconnectPolicy, SessionOptions
from ._queue import Queue
from ._session import Session
from ._types import Ack, AckStatus, CompressionAlgorithmType, Message, PropertyType
from .exceptions import *  # noqa: F401,F403

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"
__all__ = [
    "Session",
    "Queue",
    "Message",
    "Ack",
    "AckStatus",
    "PropertyType",
    "CompressionAlgorithmType",
    "SessionOptions",
    "QueueOptions",
    "ReconnectPolicy",
    "HostHealthMonitor",
    "ManualHostHealthMonitor",
    "events",
    "exceptions",
    "__version__",
    *exceptions.__all__,
]
