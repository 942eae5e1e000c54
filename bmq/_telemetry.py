"""OpenTelemetry tracing and metrics for one session (``SessionOptions(opentelemetry=True)``).

Only ``opentelemetry-api`` is used (``pip install bmq[otel]``); bmq never configures an exporter:
spans and measurements go to whatever tracer and meter providers the application installed
(none installed: the API's no-op ones). Names and attributes follow the OpenTelemetry messaging
semantic conventions:

- a PRODUCER span ``send <queue URI>`` per post call, from the call until its last ACK, with the
  ACK status (``error.type`` and an ERROR status when it is not SUCCESS); the trace context goes
  into the message properties (W3C ``traceparent``, through the application's global propagator),
  so any consumer that reads properties can continue the trace;
- a CONSUMER span ``process <queue URI>`` (``on_message``) or ``receive <queue URI>`` (``get()``)
  per delivered message, child of the producer's context found in its properties, from
  delivery until :meth:`bmq.Message.confirm` (a message never confirmed ends no span);
  ``on_message`` runs with that span current, so the application's own spans nest under it;
- counters ``messaging.client.sent.messages`` and ``messaging.client.consumed.messages`` and
  histograms ``messaging.client.operation.duration`` (post → ACK) and
  ``messaging.process.duration`` (delivery → confirm), in seconds.

When the option is off none of this module is imported and the hot paths test one attribute
for None.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ._types import Ack, AckStatus, Message
from ._version import __version__
from .exceptions import InvalidArgumentError

__all__ = ["SendTrace", "Telemetry"]

SYSTEM = "blazingmq"


def _import_api() -> Any:
    try:
        from opentelemetry import metrics, propagate, trace
    except ImportError as e:
        raise InvalidArgumentError(
            "SessionOptions(opentelemetry=True) needs the OpenTelemetry API: pip install 'bmq[otel]' "
            f"(or opentelemetry-api) ({e})") from None
    return metrics, propagate, trace


class SendTrace:
    """The producer span of one post call; :meth:`end` is called with its acks (once)."""

    __slots__ = ("_telemetry", "_span", "_start", "_attributes", "_count", "_ended")

    def __init__(self, telemetry: "Telemetry", span: Any, attributes: Dict[str, Any], count: int) -> None:
        self._telemetry = telemetry
        self._span = span
        self._start = time.monotonic()
        self._attributes = attributes
        self._count = count
        self._ended = threading.Lock()  # acquired by the first end(): a span ends once

    def end(self, acks: Sequence[Optional[Ack]], error: Optional[BaseException] = None) -> None:
        """The post call is settled (``acks``) or failed before anything was sent (``error``)."""
        if not self._ended.acquire(blocking=False):
            return
        t = self._telemetry
        span = self._span
        failed = [ack for ack in acks if ack is not None and ack.status is not AckStatus.SUCCESS]
        if len(acks) == 1 and acks[0] is not None:
            span.set_attribute("messaging.message.id", acks[0].guid_hex)
        error_type = None
        if error is not None:
            error_type = type(error).__name__
            span.record_exception(error)
        elif failed:
            error_type = failed[0].status.name
            span.set_attribute("messaging.blazingmq.ack.failed_count", len(failed))
        if acks and acks[0] is not None:
            span.set_attribute("messaging.blazingmq.ack.status", failed[0].status.name if failed else "SUCCESS")
        attributes = self._attributes
        if error_type is not None:
            span.set_attribute("error.type", error_type)
            span.set_status(t.status_error, error_type)
            attributes = {**attributes, "error.type": error_type}
        span.end()
        t.sent.add(self._count, attributes)
        t.operation_duration.record(time.monotonic() - self._start, attributes)


class _ReceiveTrace:
    """The consumer span of one delivered message, ended by its confirm."""

    __slots__ = ("span", "_start", "_attributes", "_ended")

    def __init__(self, span: Any, attributes: Dict[str, Any]) -> None:
        self.span = span
        self._start = time.monotonic()
        self._attributes = attributes
        self._ended = threading.Lock()

    def end(self, telemetry: "Telemetry") -> None:
        if not self._ended.acquire(blocking=False):
            return
        self.span.end()
        telemetry.process_duration.record(time.monotonic() - self._start, self._attributes)


class Telemetry:
    """The tracer, meter and propagator of one session (see the module docstring).

    Raises:
        InvalidArgumentError: the OpenTelemetry API is not installed (says what to install).
    """

    def __init__(self, host: str, port: int) -> None:
        metrics, self._propagate, self._trace = _import_api()
        self._tracer = self._trace.get_tracer("bmq", __version__)
        meter = metrics.get_meter("bmq", __version__)
        self.status_error = self._trace.StatusCode.ERROR
        self._server: Dict[str, Any] = {}
        self.connected_to(host, port)
        self.sent = meter.create_counter(
            "messaging.client.sent.messages", unit="{message}", description="Messages posted (counted at their ACK)")
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages", unit="{message}", description="Messages delivered to the application")
        self.operation_duration = meter.create_histogram(
            "messaging.client.operation.duration", unit="s", description="From a post call to its last ACK")
        self.process_duration = meter.create_histogram(
            "messaging.process.duration", unit="s", description="From a message's delivery to its confirm")

    def connected_to(self, host: str, port: int) -> None:
        """Name the broker address in use in what follows (a session given several addresses
        moves to another one after a failover)."""
        self._server = {"server.address": host, "server.port": port}

    def _common(self, uri: str, operation: str) -> Tuple[str, Dict[str, Any]]:
        """The destination (the URI without ``?id=``) and the attributes every span and
        measurement of ``operation`` on it carries."""
        destination = uri.split("?", 1)[0]
        return destination, {"messaging.system": SYSTEM, "messaging.destination.name": destination,
                             "messaging.operation.name": operation, "messaging.operation.type": operation,
                             **self._server}

    def start_send(self, uri: str, payloads: Sequence[Any], properties: Any) -> Tuple[SendTrace, Any]:
        """Start the producer span of a post call; returns it and the properties carrying its
        context (the caller's own ``traceparent``, if any, is left as it is)."""
        destination, attributes = self._common(uri, "send")
        span = self._tracer.start_span(f"send {destination}", kind=self._trace.SpanKind.PRODUCER,
                                       attributes=attributes)
        count = len(payloads)
        if count == 1:
            span.set_attribute("messaging.message.body.size", len(payloads[0]))
        else:
            span.set_attribute("messaging.batch.message_count", count)
        carrier: Dict[str, str] = {}
        self._propagate.inject(carrier, context=self._trace.set_span_in_context(span))
        if properties is None or isinstance(properties, Mapping):
            properties = {**carrier, **(properties or {})}
        else:
            properties = [{**carrier, **(p or {})} for p in properties]
        return SendTrace(self, span, attributes, count), properties

    def delivered(self, message: Message, pull: bool) -> None:
        """Reader thread: start the consumer span of ``message`` (kept on it until its confirm)."""
        operation = "receive" if pull else "process"
        destination, attributes = self._common(message.queue_uri, operation)
        app_id = message._queue.app_id
        if app_id is not None:
            attributes["messaging.consumer.group.name"] = app_id
        try:
            parent = self._propagate.extract(message.properties)
        except Exception:  # bad properties are the application's to see, not a reason to drop the message
            parent = None
        span = self._tracer.start_span(f"{operation} {destination}", context=parent,
                                       kind=self._trace.SpanKind.CONSUMER, attributes={
                                           **attributes, "messaging.message.id": message.guid_hex,
                                           "messaging.message.body.size": len(message.data)})
        message._trace = _ReceiveTrace(span, attributes)
        self.consumed.add(1, attributes)

    def confirmed(self, messages: List[Message]) -> None:
        """End the consumer spans of confirmed messages."""
        for message in messages:
            trace = getattr(message, "_trace", None)
            if trace is not None:
                trace.end(self)

    def wrap_on_message(self, on_message: Callable[[Message], None]) -> Callable[[Message], None]:
        """``on_message`` run with the message's consumer span current (the application's own
        spans become its children)."""
        use_span = self._trace.use_span

        def traced(message: Message) -> None:
            trace = getattr(message, "_trace", None)
            if trace is None:
                on_message(message)
                return
            with use_span(trace.span, end_on_exit=False):
                on_message(message)

        return traced
