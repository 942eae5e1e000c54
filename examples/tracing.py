"""OpenTelemetry across a producer and a consumer: one trace from post() to the consumer's own work.

Needs the OpenTelemetry SDK (``pip install 'bmq[otel]' opentelemetry-sdk``); a real application
would install an exporter (OTLP, Jaeger, ...) instead of the in-memory one used here to print
the trace as a tree.

    python examples/tracing.py [tcp://host:port]
"""
from __future__ import annotations

import argparse
import threading
from typing import Any, Dict, List, Optional

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import bmq
from bmq.broker import broker_address

URI = "bmq://bmq.test.mem.priority/traced-orders"


def render(spans: List[Any]) -> str:
    """The spans as an indented tree, children under their parent, with durations."""
    children: Dict[Optional[int], List[Any]] = {}
    ids = {span.context.span_id for span in spans}
    for span in sorted(spans, key=lambda s: s.start_time):
        parent = span.parent.span_id if span.parent is not None and span.parent.span_id in ids else None
        children.setdefault(parent, []).append(span)
    lines: List[str] = []

    def walk(parent: Optional[int], depth: int) -> None:
        for span in children.get(parent, []):
            took = (span.end_time - span.start_time) / 1e6
            keys = ("messaging.operation.type", "messaging.message.id", "messaging.blazingmq.ack.status")
            shown = ", ".join(f"{k.rsplit('.', 1)[-1]}={span.attributes[k]}" for k in keys if k in span.attributes)
            lines.append(f"{'  ' * depth}{span.name} [{span.kind.name}] {took:.2f} ms  {shown}".rstrip())
            walk(span.context.span_id, depth + 1)

    walk(None, 0)
    return "\n".join(lines)


def main(broker: Optional[str] = None) -> List[Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("orders-app")
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(provider)  # bmq uses the global provider, as instrumentations do
    else:  # already installed (e.g. by a test run): read its spans instead
        trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[attr-defined]
    options = bmq.SessionOptions(opentelemetry=True)
    done = threading.Event()

    def on_message(message: bmq.Message) -> None:
        with tracer.start_as_current_span("apply order"):  # a child of bmq's consumer span
            pass
        message.confirm()
        done.set()

    with broker_address(broker) as address, bmq.Session(address, options) as producer, \
            bmq.Session(address, options) as consumer:
        consumer.open_queue(URI, read=True, on_message=on_message)
        queue = producer.open_queue(URI, write=True)
        with tracer.start_as_current_span("checkout"):  # the application's span: bmq's send span nests in it
            queue.post(b"order #1", properties={"kind": "new"})
        if not done.wait(10):
            raise SystemExit("the message did not arrive within 10 s")
    spans = list(exporter.get_finished_spans())
    print(render(spans))
    return spans


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("broker", nargs="?", help="a broker, e.g. tcp://localhost:30114 (default: an embedded one)")
    main(parser.parse_args().broker)
