"""The examples run against the embedded broker and do what they say."""
from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
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
