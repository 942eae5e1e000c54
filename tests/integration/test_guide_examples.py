"""The user guide's runnable recipes (docs/threads.md, docs/asyncio.md): a consumer stopped by
SIGTERM loses nothing, and asyncio code posts and consumes through bmq's futures and callbacks."""
from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import bmq

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
