"""The real BlazingMQ broker (``bmqbrkr`` from ``../shared/bmqbrkr``) as a test peer.

bmq's embedded broker shares bmq's codec, so a mistake made symmetrically on both sides is
invisible between them; the real broker is the independent witness. :class:`RealBroker`
starts ``../shared/bmqbrkr/run`` on a free 127.0.0.1 port with a working directory of the
test's, waits until the port accepts connections, and stops it with SIGTERM (or SIGKILL, a
crash). Restarting on the same directory keeps the persistent domains' storage.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

#: How long a starting broker may take to accept connections (it usually needs ~1 s).
START_TIMEOUT = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_listening(process: subprocess.Popen, port: int, timeout: float, what: str,
                   output: Callable[[], str]) -> None:
    """Return once ``process`` accepts TCP connections on 127.0.0.1:``port``.

    Raises:
        RuntimeError: it exited first, or ``timeout`` seconds passed (the message ends with
            ``output()``, what it printed); the caller stops it.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} while starting:\n{output()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not accept connections on port {port} within {timeout} s:\n"
                                   f"{output()}") from None
            time.sleep(0.05)  # polling a port that is not open yet: nothing to wait on


def etc_with(home: Path, destination: Path, authentication: Dict[str, Any]) -> Path:
    """A copy of ``home/etc`` in ``destination`` whose broker config has ``authentication`` (the
    ``appConfig.authentication`` section of bmqbrkr: authenticators, anonymousCredential)."""
    shutil.copytree(Path(home) / "etc", destination)
    config = destination / "bmqbrkrcfg.json"
    port_marker = 987654321  # @PORT@ is not JSON: swap it for a number while editing
    data = json.loads(config.read_text().replace("@PORT@", str(port_marker)))
    data["appConfig"]["authentication"] = authentication
    config.write_text(json.dumps(data, indent=4).replace(str(port_marker), "@PORT@"))
    return destination


class RealBroker:
    """One ``bmqbrkr`` process; ``address`` is ``tcp://127.0.0.1:PORT``.

    Args:
        home: ``../shared/bmqbrkr`` (holds ``run``, ``bin/`` and ``etc/``).
        directory: the broker's working directory (config, logs, storage); reuse it across
            :meth:`restart` to keep persistent queues.
        etc: a config template directory (default: ``home/etc``), e.g. one with an
            ``authentication`` section.
        port: the port to listen on (default: a free one, kept across restarts).
    """

    def __init__(self, home: Path, directory: Path, *, etc: Optional[Path] = None,
                 port: Optional[int] = None) -> None:
        self.home = Path(home)
        self.directory = Path(directory)
        self.etc = Path(etc) if etc is not None else None
        self.port = port or free_port()
        self.process: Optional[subprocess.Popen] = None
        self._output: Optional[Path] = None
        self._starts = 0

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, "the broker is not running"
        return self.process.pid

    def start(self) -> "RealBroker":
        """Start the broker and return once its port accepts connections."""
        assert self.process is None, "the broker is already running"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._starts += 1
        self._output = self.directory / f"run-{self._starts}.out"
        command = [str(self.home / "run"), "--port", str(self.port), "--dir", str(self.directory)]
        if self.etc is not None:
            command += ["--etc", str(self.etc)]
        with open(self._output, "wb") as output:
            self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        try:
            wait_listening(self.process, self.port, START_TIMEOUT, "bmqbrkr", self.output_tail)
        except RuntimeError:
            self.kill()
            raise
        return self

    def output_tail(self, lines: int = 30) -> str:
        """The last lines the broker printed (stdout and stderr) in its latest start."""
        if self._output is None or not self._output.exists():
            return ""
        text = self._output.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful stop (SIGTERM); SIGKILL if it does not exit within ``timeout``."""
        self._end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """A crash: SIGKILL, no chance to flush or say goodbye to clients."""
        self._end(signal.SIGKILL, 10.0)

    def restart(self, *, crash: bool = False) -> "RealBroker":
        """Stop (or kill) and start again on the same port and directory."""
        self.kill() if crash else self.stop()
        return self.start()

    def _end(self, sig: int, timeout: float) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        # run execs bmqbrkr.tsk, so the process is the broker itself.
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def __enter__(self) -> "RealBroker":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.process.pid}" if self.process else "stopped"
        return f"<RealBroker {self.address} {state} dir={self.directory}>"
