"""``python -m bmq.broker`` / ``bmq broker``: foreground broker, logs, clean Ctrl-C."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from bmq.broker._rawclient import RawClient
from support import sigint_at_default

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)


@contextlib.contextmanager
def _broker_module() -> Iterator["subprocess.Popen[str]"]:
    """``python -m bmq.broker --port 0`` with SIGINT at its default, killed if still running."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "bmq.broker", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, preexec_fn=sigint_at_default)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_module_runs_until_interrupted_and_logs_sessions() -> None:
    with _broker_module() as proc:
        banner = proc.stdout.readline()  # type: ignore[union-attr]
        assert "tcp://127.0.0.1:" in banner, banner
        port = int(banner.split("tcp://127.0.0.1:")[1].split()[0])
        with RawClient(port) as client:
            client.open("bmq://bmq.test.mem.priority/cli", 0, write=True)
            client.close_queue("bmq://bmq.test.mem.priority/cli", 0, write=True)
            client.disconnect()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    for text in ("connected from 127.0.0.1", "opened bmq://bmq.test.mem.priority/cli", "closed bmq://", "disconnected"):
        assert text in err, err


def test_a_stop_signal_at_once_after_the_banner_stops_the_broker_cleanly() -> None:
    # A script that signals as soon as it reads the banner gets a clean stop: the signal is
    # blocked and waited for, not lost if it lands before the wait begins (it was, with a Python
    # handler and a sleep, about 1 time in 10 on 3.14: the broker then ran on).
    with _broker_module() as proc:
        assert "tcp://127.0.0.1:" in proc.stdout.readline()  # type: ignore[union-attr]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopped" in err, err

