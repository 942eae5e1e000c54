"""The durable outbox: unacknowledged PUTs survive a SIGKILL and are re-sent once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import bmq
from bmq._outbox import Outbox
from bmq.broker import Broker

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def test_session_keeps_unacknowledged_posts_for_the_next_session(tmp_path):
    with Broker() as broker:
        uri = "bmq://bmq.test.mem.priority/outbox-stop"
        options = bmq.SessionOptions(outbox_dir=str(tmp_path), disconnect_timeout=1.0)
        with bmq.Session(broker.address, options) as session:
            queue = session.open_queue(uri, write=True)
            queue.post(b"acked")
            broker.faults.withhold_acks()
            futures = queue.post_many_async([b"x", b"y"])
        assert [f.result(1.0).status for f in futures] == [bmq.AckStatus.NOT_CONNECTED] * 2
        broker.faults.reset()
        with bmq.Session(broker.address, options) as session:
            assert session.outbox_recovered == 2
            session.open_queue(uri, write=True)
            assert session.flush(10.0) == 0
        stored = broker.queue_messages(uri)
        assert sorted(m.app_data for m in stored) == [b"acked", b"x", b"y"]
        assert len(Outbox(str(tmp_path))) == 0


CHILD = textwrap.dedent(
    """
    import sys
    import threading
    import bmq
    from bmq import _codec

    address, outbox, uri, total, mode = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    with bmq.Session(address, bmq.SessionOptions(outbox_dir=outbox)) as session:
        print("recovered", session.outbox_recovered, flush=True)
        queue = session.open_queue(uri, write=True)

        def post(first, last):
            futures = []
            for start in range(first, last, 500):
                keys = range(start, start + 500)
                guids = b"".join(_codec.deterministic_guid(b"outbox-%d" % i) for i in keys)
                futures += queue.post_many_async([b"msg-%d" % i for i in keys], guids=guids)
            return futures

        if mode == "crash":
            assert all(f.result(60).status is bmq.AckStatus.SUCCESS for f in post(0, total // 2))
            print("half acked", flush=True)
            sys.stdin.readline()  # the parent withholds ACKs from here on
            post(total // 2, total)
            print("all posted", flush=True)
            threading.Event().wait()  # until SIGKILL
        futures = post(0, total)
        assert all(f.result(60).status is bmq.AckStatus.SUCCESS for f in futures)
        assert session.flush(60) == 0
        print("done", flush=True)
    """
)


def run_child(broker, outbox, uri, total, mode):
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, broker.address, str(outbox), uri, str(total), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(ROOT),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.slow
def test_sigkilled_producer_is_completed_by_a_new_process_exactly_once(tmp_path):
    total = 50_000
    uri = "bmq://bmq.test.mem.priority/outbox-kill"
    with Broker() as broker:
        child = run_child(broker, tmp_path, uri, total, "crash")
        try:
            assert child.stdout.readline().split() == ["recovered", "0"]
            assert child.stdout.readline().strip() == "half acked"
            broker.faults.withhold_acks()
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "all posted"
            child.send_signal(signal.SIGKILL)
            assert child.wait(10) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
        broker.faults.reset()
        assert broker.wait_for(lambda: not broker.clients(), 5.0)
        held_before = len(broker.queue_messages(uri))
        assert total // 2 <= held_before <= total

        second = run_child(broker, tmp_path, uri, total, "finish")
        out, _ = second.communicate(timeout=90)
        assert second.returncode == 0, out
        lines = out.split("\n")
        recovered = int(lines[0].split()[1])
        assert recovered == total // 2, "every message posted after the ACKs stopped is in the outbox"
        assert lines[-2] == "done"
        stored = broker.queue_messages(uri)
        assert len(stored) == total
        assert sorted(m.app_data for m in stored) == sorted(b"msg-%d" % i for i in range(total))
        assert len({m.guid for m in stored}) == total
    assert len(Outbox(str(tmp_path))) == 0
