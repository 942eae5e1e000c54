"""The examples run against the embedded broker (the guide's recipes against bmqbrkr too) and do what they say."""
from __future__ import annotations

import ast
import importlib.util
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import bmq

pytestmark = pytest.mark.timeout(60)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_producer_example_gets_every_ack(capsys):
    acks = load("producer").main()
    assert len(acks) == 12 and all(a.status is bmq.AckStatus.SUCCESS for a in acks)
    assert capsys.readouterr().out.count("SUCCESS") == 12


def test_consumer_example_receives_the_seeded_messages(capsys):
    payloads = load("consumer").main(idle_timeout=0.5)
    assert payloads == [b"order #%d" % n for n in range(5)]
    assert "'kind': 'new'" in capsys.readouterr().out


def test_batch_consumer_example_drains_every_seeded_message_once(capsys):
    # The drain ends at the first silence this long: a loaded machine (load average 36 seen) can
    # pause between batches of the 100,000 for more than half a second.
    assert load("batch_consumer").main(idle_timeout=5.0) == (100_000, 100)
    out = capsys.readouterr().out
    assert "first payload b'sensor-0,alarm\\n'" in out and "100000 messages (100 alarms)" in out


def test_examples_accept_an_existing_broker():
    from bmq.broker import Broker

    with Broker() as broker:
        assert len(load("producer").main(broker.address)) == 12
        assert len(load("consumer").main(broker.address, idle_timeout=0.5)) == 12


def test_tracing_example_prints_one_trace_from_the_post_to_the_consumers_work(capsys):
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk (the test extra) is not installed")
    spans = load("tracing").main()
    assert len({span.context.trace_id for span in spans}) == 1
    tree = [line.split(" [")[0] for line in capsys.readouterr().out.splitlines()]
    uri = "bmq://bmq.test.mem.priority/traced-orders"
    assert tree == ["checkout", f"  send {uri}", f"    process {uri}", "      apply order"]


def test_subscriptions_example_routes_big_eu_orders_to_their_subscription(capsys):
    received = load("subscriptions").main(idle_timeout=0.5)
    assert sorted(received["big EU"]) == [b"EU-100", b"EU-150", b"EU-999"]
    assert sorted(received["other"]) == [b"APAC-1", b"EU-5", b"EU-99", b"US-150", b"US-7"]
    assert "refused: invalid subscription expression 'region = \"EU\"'" in capsys.readouterr().out


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda path: path.stem)
def test_every_example_takes_help(path):
    if path.stem == "tracing":
        pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk (the test extra) is not installed")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(EXAMPLES.parent), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {path.name} [-h] [broker]")
    summary = ast.get_docstring(ast.parse(path.read_text())).splitlines()[0]
    assert summary in result.stdout


# The user guide's recipes (docs/threads.md, docs/asyncio.md).
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_consumer_stopped_by_a_signal_confirms_what_it_handled_and_leaves_the_rest(session, signum, tmp_path):
    uri = f"bmq://bmq.test.mem.priority/shutdown-{uuid.uuid4().hex[:8]}"
    queue = session.open_queue(uri, read=True, write=True)
    payloads = [b"job %d" % n for n in range(20_000)]
    queue.post_many(payloads)
    stderr = tmp_path / "stderr"
    with stderr.open("w") as errors:
        child = subprocess.Popen([sys.executable, str(EXAMPLES / "graceful_shutdown.py"), session.broker, uri],
                                 stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        lines = []
        while not lines or not lines[-1].startswith("handled "):   # the signal comes mid-stream
            line = child.stdout.readline()
            assert line, f"the example ended early: {stderr.read_text()}"
            lines.append(line.rstrip("\n"))
        child.send_signal(signum)
        lines += child.stdout.read().splitlines()
        child.wait(timeout=60)
    finally:
        child.kill()
    err = stderr.read_text()
    assert child.returncode == 0, err
    handled = [line.split(" ", 1)[1].encode() for line in lines if line.startswith("handled ")]
    assert lines[-1] == f"stopping after {len(handled)} messages"
    assert "Traceback" not in err
    # What the consumer handled it confirmed (never delivered again); everything else is still
    # in the queue: nothing lost, nothing handled twice.
    rest = []
    while (message := queue.get(timeout=2)) is not None:
        rest.append(message.data)
        message.confirm()
    assert sorted(handled + rest) == sorted(payloads)
    assert len(set(handled)) == len(handled)


def test_asyncio_example_posts_and_consumes_from_one_event_loop(broker_address, capsys):
    acks, received = load("asyncio_client").main(broker_address)
    assert [ack.status for ack in acks] == [bmq.AckStatus.SUCCESS] * 10
    assert sorted(received) == sorted(b"event %d" % n for n in range(10))
    assert capsys.readouterr().out.startswith("10 acknowledged")
