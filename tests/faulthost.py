"""The broker side of a fault test, in a child process: a TCP proxy (``tests/proxy.py``) in
front of a broker (a real ``bmqbrkr`` given by address, or an embedded broker started there),
driven one command at a time through the child's stdin.

The broker and proxy live in their own process so that what the test measures in its own
(RSS, threads, open fds) is the client's alone. Used by the soak (``tests/endurance.py``) and by
``tests/fault/test_reconnect_memory.py``.
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import bmq

#: How long the child may take to start, or to carry out one command.
ANSWER_TIMEOUT = 60.0


def _serve_faults(upstream: Optional[str]) -> None:
    """Child process: the proxy (and the embedded broker when ``upstream`` is None); prints
    the proxy's address, then obeys one fault command per stdin line (answering one line
    each) until ``stop`` or end of input."""
    from bmq.broker import Broker
    from proxy import Proxy

    broker = Broker().start() if upstream is None else None
    try:
        proxy = Proxy(upstream or broker.address)  # type: ignore[union-attr]
        try:
            print(proxy.address, flush=True)
            actions: Dict[str, Callable[[], Any]] = {"cut": proxy.cut, "stall": proxy.stall, "resume": proxy.resume}
            if broker is not None:
                actions.update(restart=broker.restart, drop=broker.faults.drop_connections,
                               withhold=broker.faults.withhold_acks, release=broker.faults.release_acks)
            for line in sys.stdin:
                command = line.strip()
                if command == "stop":
                    break
                print(actions[command](), flush=True)
        finally:
            proxy.close()
    finally:
        if broker is not None:
            broker.stop()


class FaultHost:
    """The proxy (and the embedded broker, without ``upstream``) in a child process: this file
    run as a script, importing the same bmq as this process, so that the RSS, threads and fds
    measured here are the client's alone.

    Args:
        upstream: the broker to proxy (``tcp://host:port``), or None for an embedded broker.

    Raises:
        RuntimeError: the child did not print its address within ANSWER_TIMEOUT.
    """

    def __init__(self, upstream: Optional[str]) -> None:
        root = str(Path(bmq.__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        # Unbuffered bytes: _answer waits on the pipe itself with select(), which a text
        # wrapper's read-ahead would defeat.
        self._process = subprocess.Popen([sys.executable, __file__, upstream or "embedded"], env=env, bufsize=0,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._unread = b""
        try:
            self.address = self._answer("start")
        except RuntimeError:
            self.close()
            raise
        if not self.address.startswith("tcp://"):
            self.close()
            raise RuntimeError(f"the soak's broker-side process did not start: {self.address!r}")

    def _answer(self, command: str) -> str:
        """The child's next line; it has ANSWER_TIMEOUT to write it."""
        deadline = time.monotonic() + ANSWER_TIMEOUT
        stdout = self._process.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self._unread:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([stdout], [], [], remaining)[0]:
                raise RuntimeError(f"the broker-side process did not answer {command!r} within {ANSWER_TIMEOUT} s")
            chunk = os.read(stdout, 4096)
            if not chunk:
                raise RuntimeError(f"the broker-side process exited ({self._process.poll()}) on {command!r}")
            self._unread += chunk
        line, self._unread = self._unread.split(b"\n", 1)
        return line.decode().strip()

    def do(self, command: str) -> str:
        """Run ``command`` (cut, stall, resume; embedded: restart, drop, withhold, release) in
        the child and return its answer (e.g. how many connections were cut).

        Raises:
            RuntimeError: no answer within ANSWER_TIMEOUT, or the child exited.
        """
        self._process.stdin.write(command.encode() + b"\n")  # type: ignore[union-attr]
        return self._answer(command)

    def close(self) -> None:
        """Stop the child (killed unless it exits within ANSWER_TIMEOUT) and close the pipes."""
        try:
            self._process.stdin.write(b"stop\n")  # type: ignore[union-attr]
        except OSError:  # it exited already
            pass
        self._process.stdin.close()  # type: ignore[union-attr]
        try:
            self._process.wait(ANSWER_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(ANSWER_TIMEOUT)
        self._process.stdout.close()  # type: ignore[union-attr]

if __name__ == "__main__":
    _serve_faults(None if sys.argv[1] == "embedded" else sys.argv[1])
