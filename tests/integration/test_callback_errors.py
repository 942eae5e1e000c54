"""An exception escaping a callback reaches stderr (logging not configured) or the log
(configured), once, with its traceback; the session goes on; the message whose on_message
raised stays unconfirmed and is redelivered once its consumer is gone (BlazingMQ's rule)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import bmq

ROOT = Path(__file__).resolve().parents[2]

# Run in a fresh interpreter: pytest configures logging in its own process.
SCRIPT = r"""
import logging, sys, threading
import bmq

broker, uri, configure = sys.argv[1], sys.argv[2], sys.argv[3] == "configured"
if configure:
    logging.basicConfig(stream=sys.stdout, format="LOGGED %(levelname)s %(name)s: %(message)s")
handled = []
done = threading.Event()

def on_message(message):
    if message.data == b"first":
        raise ValueError("on_message failed on purpose")
    handled.append(message.data)
    message.confirm()
    done.set()

def on_ack(ack):
    raise RuntimeError("on_ack failed on purpose")

with bmq.Session(broker) as session:
    writer = session.open_queue(uri, read=True, write=True, on_message=on_message)
    writer.post_async(b"first", on_ack=on_ack).result(30)
    writer.post(b"second")
    assert done.wait(30), "the callback after the failing ones never ran"
print("HANDLED", handled)
"""


def run(broker_address: str, uri: str, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, broker_address, uri, mode], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_callback_errors_reach_stderr_without_logging_and_the_message_is_redelivered(broker_address):
    uri = f"bmq://bmq.test.mem.priority/callback-errors-{time.monotonic_ns()}"
    result = run(broker_address, uri, "plain")
    assert result.returncode == 0, result.stderr
    assert "HANDLED [b'second']" in result.stdout
    assert result.stderr.count("Traceback (most recent call last)") == 2, result.stderr
    assert "ValueError: on_message failed on purpose" in result.stderr
    assert "RuntimeError: on_ack failed on purpose" in result.stderr
    assert "bmq callback on_message raised ValueError" in result.stderr
    # Never confirmed: redelivered once its consumer is gone.
    with bmq.Session(broker_address) as session:
        message = session.open_queue(uri, read=True).get(timeout=30)
        assert message is not None and message.data == b"first"
        message.confirm()


def test_callback_errors_go_to_the_log_alone_once_logging_is_configured(broker_address):
    uri = f"bmq://bmq.test.mem.priority/callback-errors-logged-{time.monotonic_ns()}"
    result = run(broker_address, uri, "configured")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "LOGGED ERROR bmq._dispatch: bmq callback on_message raised ValueError" in result.stdout
    assert "LOGGED ERROR bmq._dispatch: bmq callback on_ack raised RuntimeError" in result.stdout
    assert result.stdout.count("Traceback (most recent call last)") == 2
    with bmq.Session(broker_address) as session:  # leave the queue empty
        session.open_queue(uri, read=True).get(timeout=30).confirm()
