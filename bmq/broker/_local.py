"""Run code against a given broker address, or an embedded broker that lives for a block."""
from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator, Optional

from ..exceptions import Error

_LISTENING = re.compile(r"listening on (tcp://\S+)")


@contextlib.contextmanager
def broker_address(address: Optional[str] = None, *, separate_process: bool = False,
                   start_timeout: float = 30.0) -> Iterator[str]:
    """Yield ``address`` if given, else the address of an embedded broker running for the block.

    Args:
        address: a broker address such as ``"tcp://localhost:30114"``; None starts one.
        separate_process: run the embedded broker in a child Python process
            (``python -m bmq.broker --port 0``) instead of threads of this one, so that it
            does not share the GIL with the client: what benchmarks want.
        start_timeout: seconds to wait for a child broker to listen.

    Raises:
        bmq.exceptions.Error: the child broker did not start in time.

    Thread-safety: each call owns its broker; the block's body may use it from any thread.
    """
    if address:
        yield address
    elif separate_process:
        with _child_broker(start_timeout) as child_address:
            yield child_address
    else:
        from ._server import Broker

        with Broker() as broker:
            yield broker.address


@contextlib.contextmanager
def _child_broker(start_timeout: float) -> Iterator[str]:
    # The child imports the same bmq as this process, installed or from a source checkout.
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen([sys.executable, "-m", "bmq.broker", "--port", "0"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=env)
    lines: "queue.Queue[str]" = queue.Queue()
    # A thread keeps draining stdout so the child never blocks on a full pipe.
    threading.Thread(target=lambda: [lines.put(line) for line in child.stdout], name="bmq-broker-child-stdout",
                     daemon=True).start()
    try:
        try:
            match = _LISTENING.search(lines.get(timeout=start_timeout))
        except queue.Empty:
            match = None
        if match is None:
            raise Error(f"the embedded broker process (pid {child.pid}) did not start within {start_timeout}s")
        yield match.group(1)
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)
