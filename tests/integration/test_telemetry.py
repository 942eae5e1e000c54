"""OpenTelemetry: a trace started by a producer is continued by a consumer through the broker
(both brokers), spans carry the messaging semantic conventions and the ACK status, metrics
count what was sent and consumed, and nothing of it happens (or is imported) when it is off.

The OpenTelemetry SDK (a test dependency only) is installed as the global provider once per
test run, with an in-memory span exporter and metric reader that each test reads from.
"""
from __future__ import annotations

import re
import subprocess
import sys
import threading
from typing import Any, Dict, Iterator, List

import pytest

import bmq
from support import drain, fresh_uri

trace_sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk (the test extra) is not installed")
from opentelemetry import metrics, trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


class Telemetry:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        provider = trace.get_tracer_provider()
        if not isinstance(provider, trace_sdk.TracerProvider):  # else installed already (examples/tracing.py)
            provider = trace_sdk.TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.metrics = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[self.metrics]))
        self.tracer = trace.get_tracer("tests")

    def finished(self, name_prefix: str = "") -> List[Any]:
        return [s for s in self.spans.get_finished_spans() if s.name.startswith(name_prefix)]

    def sums(self) -> Dict[str, float]:
        """Counter totals and histogram counts by metric name (all attributes together)."""
        totals: Dict[str, float] = {}
        data = self.metrics.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        totals[metric.name] = totals.get(metric.name, 0) + (point.count if value is None else value)
        return totals


_installed: List[Telemetry] = []


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    if not _installed:  # the global providers can be set once per process
        _installed.append(Telemetry())
    telemetry = _installed[0]
    telemetry.spans.clear()
    telemetry.metrics.get_metrics_data()  # cumulative: tests compare before/after
    yield telemetry


def traced() -> bmq.SessionOptions:
    return bmq.SessionOptions(opentelemetry=True)


def test_a_producers_trace_is_continued_by_an_on_message_consumer(otel, broker_address):
    uri = fresh_uri(prefix="otel")
    received: List[bmq.Message] = []
    done = threading.Event()

    def on_message(message: bmq.Message) -> None:
        with otel.tracer.start_as_current_span("handle order"):
            received.append(message)
        message.confirm()
        done.set()

    with bmq.Session(broker_address, traced()) as producer, bmq.Session(broker_address, traced()) as consumer:
        consumer.open_queue(uri, read=True, on_message=on_message)
        queue = producer.open_queue(uri, write=True)
        ack = queue.post(b"order #1", properties={"kind": "new"})
        assert done.wait(10)
    send, = otel.finished("send ")
    process, = otel.finished("process ")
    handler, = otel.finished("handle order")
    assert send.kind is trace.SpanKind.PRODUCER and process.kind is trace.SpanKind.CONSUMER
    assert send.name == process.name.replace("process", "send") == f"send {uri}"
    # One trace: producer -> consumer (child) -> the application's span (child).
    assert process.context.trace_id == send.context.trace_id == handler.context.trace_id
    assert process.parent.span_id == send.context.span_id
    assert handler.parent.span_id == process.context.span_id
    message = received[0]
    trace_id, span_id = TRACEPARENT.match(message.properties["traceparent"]).groups()
    assert (int(trace_id, 16), int(span_id, 16)) == (send.context.trace_id, send.context.span_id)
    assert message.properties["kind"] == "new"
    for span in (send, process):
        assert span.attributes["messaging.system"] == "blazingmq"
        assert span.attributes["messaging.destination.name"] == uri
        assert span.attributes["messaging.message.id"] == ack.guid_hex
        assert span.attributes["server.port"] == int(broker_address.rsplit(":", 1)[1])
    assert send.attributes["messaging.operation.type"] == "send"
    assert send.attributes["messaging.blazingmq.ack.status"] == "SUCCESS"
    assert send.attributes["messaging.message.body.size"] == len(b"order #1")
    assert process.attributes["messaging.operation.name"] == "process"
    assert send.status.is_ok and "error.type" not in send.attributes


def test_a_batch_has_one_send_span_and_each_pulled_message_a_receive_span_ending_at_confirm(otel, broker_address):
    uri = fresh_uri(prefix="otel-batch")
    before = otel.sums()
    with bmq.Session(broker_address, traced()) as session:
        queue = session.open_queue(uri, read=True, write=True)
        acks = queue.post_many([b"m%d" % i for i in range(5)])
        got = drain(queue, 5)
        assert otel.finished("receive ") == []  # delivered, not yet confirmed
        session.confirm_many(got[:3])
        assert len(otel.finished("receive ")) == 3
        queue.confirm_many(got[3:])
    send, = otel.finished("send ")
    receives = otel.finished("receive ")
    assert send.attributes["messaging.batch.message_count"] == 5 and "messaging.message.id" not in send.attributes
    assert {s.attributes["messaging.message.id"] for s in receives} == {a.guid_hex for a in acks}
    assert all(s.parent.span_id == send.context.span_id for s in receives)
    after = otel.sums()
    grew = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    assert grew["messaging.client.sent.messages"] == 5
    assert grew["messaging.client.consumed.messages"] == 5
    assert grew["messaging.client.operation.duration"] == 1  # one post call
    assert grew["messaging.process.duration"] == 5


def test_a_fan_out_consumer_span_names_its_app_id(otel, broker_address):
    uri = fresh_uri("bmq.test.mem.fanout", prefix="otel-fanout")
    with bmq.Session(broker_address, traced()) as session:
        reader = session.open_queue(uri + "?id=foo", read=True)
        session.open_queue(uri, write=True).post(b"x")
        reader.confirm_many(drain(reader, 1))
    receive, = otel.finished("receive ")
    assert receive.attributes["messaging.consumer.group.name"] == "foo"
    assert receive.attributes["messaging.destination.name"] == uri


def test_a_nack_marks_the_send_span_as_an_error_with_the_ack_status(otel, broker):
    with bmq.Session(broker.address, traced()) as session:
        queue = session.open_queue(fresh_uri(prefix="otel-nack"), write=True)
        broker.faults.nack_next(1)
        with pytest.raises(bmq.PostError):
            queue.post(b"refused")
    send, = otel.finished("send ")
    assert send.status.status_code is trace.StatusCode.ERROR
    assert send.attributes["error.type"] == send.attributes["messaging.blazingmq.ack.status"] == "UNKNOWN"


def test_a_post_refused_before_sending_ends_its_span_with_the_error(otel, broker):
    with bmq.Session(broker.address, traced()) as session:
        queue = session.open_queue(fresh_uri(prefix="otel-bad"), write=True)
        with pytest.raises(bmq.PropertyError):
            queue.post(b"x", properties={"bad": object()})
    send, = otel.finished("send ")
    assert send.attributes["error.type"] == "PropertyError" and not send.status.is_ok


def test_off_by_default_no_property_no_span_and_opentelemetry_never_imported(broker):
    code = (
        "import sys, bmq\n"
        "from bmq.broker import Broker\n"
        "with Broker() as b, bmq.Session(b.address) as s:\n"
        "    q = s.open_queue('bmq://bmq.test.mem.priority/off', read=True, write=True)\n"
        "    q.post(b'x')\n"
        "    m = q.get(timeout=5)\n"
        "    assert m.properties == {}, m.properties\n"
        "    m.confirm()\n"
        "assert not [n for n in sys.modules if n.startswith('opentelemetry')]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_without_the_api_turning_it_on_says_what_to_install(monkeypatch, broker):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails as if not installed
    with pytest.raises(bmq.InvalidArgumentError, match=r"pip install 'bmq\[otel\]'"):
        bmq.Session(broker.address, traced())


def test_the_official_sdk_consumer_receives_the_trace_context(otel, broker_address):
    """Any SDK that reads properties can continue the trace: the official one sees the
    ``traceparent`` of bmq's send span as an ordinary STRING property."""
    blazingmq = pytest.importorskip("blazingmq", reason="the official blazingmq SDK is not installed")
    uri = fresh_uri(prefix="otel-official")
    received: List[Dict[str, Any]] = []
    done = threading.Event()

    def on_message(message: Any, handle: Any) -> None:
        received.append(dict(message.properties))
        handle.confirm()
        done.set()

    consumer = blazingmq.Session(lambda event: None, on_message=on_message, broker=broker_address)
    try:
        consumer.open_queue(uri, read=True)
        with bmq.Session(broker_address, traced()) as producer:
            producer.open_queue(uri, write=True).post(b"to the official SDK", properties={"kind": "new"})
        assert done.wait(10)
    finally:
        consumer.stop()
    send, = otel.finished("send ")
    trace_id, span_id = TRACEPARENT.match(received[0]["traceparent"]).groups()
    assert (int(trace_id, 16), int(span_id, 16)) == (send.context.trace_id, send.context.span_id)
    assert received[0]["kind"] == "new"


def test_spans_name_the_broker_address_in_use_not_the_first_configured(otel, broker_address):
    from realbroker import free_port

    unreachable = f"tcp://127.0.0.1:{free_port()}"
    with bmq.Session([unreachable, broker_address], traced()) as session:
        assert session.broker == broker_address
        session.open_queue(fresh_uri(prefix="otel-address"), write=True).post(b"x")
    send, = otel.finished("send ")
    assert send.attributes["server.port"] == int(broker_address.rsplit(":", 1)[1])
