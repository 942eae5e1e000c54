"""CPU time of this benchmark's child processes (Spark's JVM and Python workers, a broker), by role.

Linux only (reads ``/proc``). Spark starts and ends Python workers while a query runs (the
streaming source's process lives as long as its query), so the processes are sampled while
the measured work runs and each one's last reading counts: a process that ends loses at most
the CPU of its last sampling period.
"""
from __future__ import annotations

import os
import threading
from typing import Dict, Iterator, Optional, Tuple

# Roles by a process's command line, first match wins (the JVM's names pyspark's jars).
_ROLES = (
    ("bmqbrkr", "broker"),
    ("bmq.broker", "broker"),
    ("/bin/java", "jvm"),
    ("python_streaming_source_runner", "driver_source"),
    ("pyspark.daemon pyspark.worker", "executors"),
    ("pyspark", "python_planning"),
)
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _processes() -> Iterator[Tuple[int, int, float, str]]:
    """``(pid, parent pid, CPU seconds, command line)`` of every readable process."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        # The command name (2nd field) may hold spaces: the fields after it follow its ')'.
        fields = stat[stat.rindex(b")") + 2:].split()
        yield int(name), int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS, cmdline


def _role(cmdline: str) -> str:
    return next((role for needle, role in _ROLES if needle in cmdline), "other")


class ChildCpu:
    """Samples the CPU seconds of this process's descendants, by role, between ``with`` and its end.

    ``seconds`` (after the block) maps a role to the CPU seconds its processes spent inside the
    block: ``jvm`` (Spark's driver and executor threads, one process in local mode),
    ``driver_source`` (the Python process running a streaming source's driver side),
    ``executors`` (the Python workers running tasks), ``python_planning`` (Spark's other Python
    workers), ``broker`` and ``other``.
    """

    def __init__(self, period: float = 0.2) -> None:
        self._period = period
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._start: Dict[int, float] = {}
        self._last: Dict[int, Tuple[float, str]] = {}
        self.seconds: Dict[str, float] = {}

    def _sample(self) -> Dict[int, Tuple[float, str]]:
        table = list(_processes())
        children: Dict[int, list] = {}
        for pid, parent, cpu, cmdline in table:
            children.setdefault(parent, []).append((pid, cpu, cmdline))
        found: Dict[int, Tuple[float, str]] = {}
        todo = [os.getpid()]
        while todo:
            for pid, cpu, cmdline in children.get(todo.pop(), ()):
                found[pid] = (cpu, cmdline)
                todo.append(pid)
        return found

    def _update(self) -> None:
        for pid, (cpu, cmdline) in self._sample().items():
            # An ended process (a zombie until reaped) reads with an empty command line.
            self._last[pid] = (cpu, cmdline or self._last.get(pid, (0.0, ""))[1])

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            self._update()

    def __enter__(self) -> "ChildCpu":
        self._start = {pid: cpu for pid, (cpu, _) in self._sample().items()}
        self._thread = threading.Thread(target=self._run, name="child-cpu", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self._update()
        seconds: Dict[str, float] = {}
        for pid, (cpu, cmdline) in self._last.items():
            role = _role(cmdline)
            seconds[role] = seconds.get(role, 0.0) + cpu - self._start.get(pid, 0.0)
        self.seconds = seconds
