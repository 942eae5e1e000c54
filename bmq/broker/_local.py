"""Run code against a given broker address, or an embedded broker that lives for a block."""
from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Iterator, Optional, Sequence, Union

from ..exceptions import Error

_LISTENING = re.compile(r"listening on (tcp://\S+)")


@contextlib.contextmanager
def broker_address(address: Union[None, str, Sequence[str]] = None, *, separate_process: bool = False,
                   start_timeout: float = 30.0) -> Iterator[Union[str, Sequence[str]]]:
    """Yield ``address`` if given, else the address of an embedded broker running for the block.

    Args:
        address: a broker address such as ``"tcp://localhost:30114"``, or several (what
            :class:`bmq.Session` takes); None or empty starts one.
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
    # The child must import the same bmq as this process. Its working directory is the
    # directory holding that bmq package: with the caller's directory instead, a source
    # checkout there (which has no compiled codec) would shadow an installed bmq.
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen([sys.executable, "-m", "bmq.broker", "--port", "0"], cwd=package_root,
                                 stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
        lines: "queue.Queue[Optional[str]]" = queue.Queue()

        def drain() -> None:
            # Keeps draining stdout so the child never blocks on a full pipe; None = it exited.
            for line in child.stdout:  # type: ignore[union-attr]
                lines.put(line)
            lines.put(None)

        threading.Thread(target=drain, name="bmq-broker-child-stdout", daemon=True).start()
        try:
            yield _await_listening(child, lines, stderr, start_timeout)
        finally:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(5)


def _await_listening(child: subprocess.Popen, lines: "queue.Queue[Optional[str]]", stderr: IO[bytes],
                     start_timeout: float) -> str:
    """The address the child prints once it listens; an Error at once if it exits first."""
    deadline = time.monotonic() + start_timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise Error(f"the embedded broker process (pid {child.pid}) did not start within {start_timeout}s"
                        f"{_tail(stderr)}") from None
        if line is None:
            code = child.wait(5)
            raise Error(f"the embedded broker process (pid {child.pid}) exited with code {code} before "
                        f"listening{_tail(stderr)}")
        match = _LISTENING.search(line)
        if match:
            return match.group(1)


def _tail(stderr: IO[bytes], lines: int = 15) -> str:
    stderr.seek(0)
    text = stderr.read().decode(errors="replace").strip().splitlines()[-lines:]
    return ("; its stderr ends with:\n" + "\n".join(text)) if text else ""
