"""Opening bmq sessions for the Spark source: one place that maps options to the client API.

Every Spark task (executor) and the streaming driver opens its own :class:`bmq.Session`: a
session cannot cross process boundaries, and a CONFIRM must come from the session that
received the message.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional, Tuple

import bmq

from ._options import CommonOptions, WriteOptions

__all__ = ["connect", "held_messages", "open_producer", "open_consumer", "probe", "probe_broker"]

_log = logging.getLogger(__name__)


def connect(options: CommonOptions, ack_timeout: float = 120.0) -> "bmq.Session":
    """A started session to ``options.broker``.

    Raises:
        bmq.ConnectionError: the broker cannot be reached (the message names it).
    """
    session_options = bmq.SessionOptions(connect_timeout=options.connect_timeout, ack_timeout=ack_timeout)
    # Several addresses, comma-separated, are the session's failover list.
    brokers = [address.strip() for address in options.broker.split(",") if address.strip()]
    try:
        return bmq.Session(broker=brokers, options=session_options)
    except bmq.ConnectionError as e:
        raise type(e)(f"blazingmq: cannot reach the broker at {options.broker}: {e}") from e


@contextlib.contextmanager
def open_producer(options: WriteOptions) -> Iterator["bmq.Queue"]:
    """A queue opened for writing on a fresh session, both closed on exit.

    Raises:
        bmq.ConnectionError: the broker cannot be reached.
        bmq.BrokerError: the broker refused to open the queue.
    """
    with connect(options, options.ack_timeout) as session:
        yield session.open_queue(options.queue, write=True)


def open_consumer(options: CommonOptions, max_messages: int, max_bytes: int) -> Tuple["bmq.Session", "bmq.Queue"]:
    """A started session and the queue opened on it for reading in batches (``Queue.get_batch``);
    the caller stops the session.

    Args:
        options: broker and queue, and the reader's ``subscription`` expression if it has one.
        max_messages: the queue's ``max_unconfirmed_messages``.
        max_bytes: the queue's ``max_unconfirmed_bytes``.

    Raises:
        bmq.ConnectionError: the broker cannot be reached.
        bmq.BrokerError: the broker refused to open the queue.
    """
    session = connect(options)
    try:
        expression = getattr(options, "subscription", "")
        queue_options = bmq.QueueOptions(max_unconfirmed_messages=max_messages, max_unconfirmed_bytes=max_bytes,
                                         subscriptions=(expression,) if expression else ())
        return session, session.open_queue(options.queue, read=True, options=queue_options, batches=True)
    except BaseException:
        session.stop()
        raise


def held_messages(options: CommonOptions) -> Optional[int]:
    """How many messages the broker holds for the reader's appId (the queue's ``?id=``, else
    the default one), delivered or not, from its admin statistics; None when it cannot tell.

    It cannot tell for a ``subscription`` reader (the count includes the messages the
    subscription leaves to others), nor when no broker of the list answers the admin command
    (a proxy answers only partially: then the count may be 0 while the cluster holds more).
    """
    if getattr(options, "subscription", ""):
        return None
    app_id = bmq.parse_uri(options.queue).app_id or "__default"
    for address in (address.strip() for address in options.broker.split(",") if address.strip()):
        try:
            with bmq.Admin(address, timeout=options.connect_timeout) as admin:
                app = admin.queue_stats(options.queue).apps.get(app_id)
            return app.messages if app is not None else 0
        except bmq.Error as e:
            _log.info("blazingmq: %s cannot tell what it holds for %s: %s", address, options.queue, e)
    return None


def probe(options: WriteOptions) -> None:
    """Check on the driver, before Spark starts tasks, that the queue can be opened for writing.

    Raises:
        bmq.ConnectionError: the broker cannot be reached.
        bmq.BrokerError: the broker refused to open the queue.
    """
    with open_producer(options):
        _log.debug("blazingmq: %s on %s is writable", options.queue, options.broker)


def probe_broker(options: CommonOptions) -> None:
    """Check on the driver, before Spark starts tasks, that the broker can be reached.

    Readers check no more than this: opening the queue for reading here would make the
    broker deliver messages to a session that is about to close, and redeliver them.

    Raises:
        bmq.ConnectionError: the broker cannot be reached (the message names it).
    """
    with connect(options):
        _log.debug("blazingmq: %s is reachable", options.broker)
