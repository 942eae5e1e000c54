"""CPU time of this benchmark's child processes (Spark's JVM and Python workers, a broker), by role.

Linux only (reads ``/proc``). Spark starts and ends Python workers while a query runs (the
streaming source's process lives as long as its query), so the processes are sampled while
the measured work runs and each one's last reading counts: a process that ends loses at most
the CPU of its last sampling period.
"""
from __future__ import annotations

import os
import threading
from typing import Dict, Iterator, Optional, Set, Tuple

# Roles by a process's command line, first match wins (the JVM's names pyspark's jars).
_ROLES = (
    ("bmqbrkr", "broker"),
    ("bmq.broker", "broker"),
    ("/bin/java", "jvm"),
    ("python_streaming_source_runner", "driver_source"),
    ("multiprocessing.spawn", "posting_processes"),
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


def cpus_allowed(pid: int) -> Set[str]:
    """The distinct ``Cpus_allowed_list`` values (``"0"``, ``"0-1"``) of every thread of
    process ``pid``: what the scheduler lets each one run on (empty if it ended)."""
    found: Set[str] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as f:
                found.update(line.split(":", 1)[1].strip() for line in f if line.startswith("Cpus_allowed_list"))
        except OSError:  # the thread ended meanwhile
            continue
    return found


class ChildCpu:
    """Samples the CPU seconds of this process's descendants, by role, between ``with`` and its end.

    ``seconds`` (after the block) maps a role to the CPU seconds its processes spent inside the
    block: ``jvm`` (Spark's driver and executor threads, one process in local mode),
    ``driver_source`` (the Python process running a streaming source's driver side),
    ``executors`` (the Python workers running tasks), ``python_planning`` (Spark's other Python
    workers), ``posting_processes`` (the benchmark's own ``multiprocessing`` children), ``broker``
    and ``other``. ``affinity`` maps a role to the ``Cpus_allowed_list``
    values its threads had, read when each process is first seen and again at the block's end
    (for the threads started since): the proof of where ``--broker-cpus`` / ``--spark-cpus``
    let each role run.
    """

    def __init__(self, period: float = 0.2) -> None:
        self._period = period
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._start: Dict[int, float] = {}
        self._last: Dict[int, Tuple[float, str]] = {}
        self.seconds: Dict[str, float] = {}
        self.affinity: Dict[str, Set[str]] = {}

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

    def _note_affinity(self, pid: int, cmdline: str) -> None:
        if cmdline:
            self.affinity.setdefault(_role(cmdline), set()).update(cpus_allowed(pid))

    def _update(self, final: bool = False) -> None:
        for pid, (cpu, cmdline) in self._sample().items():
            if final or pid not in self._last:
                self._note_affinity(pid, cmdline)
            # An ended process (a zombie until reaped) reads with an empty command line.
            self._last[pid] = (cpu, cmdline or self._last.get(pid, (0.0, ""))[1])

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            self._update()

    def __enter__(self) -> "ChildCpu":
        sample = self._sample()
        self._start = {pid: cpu for pid, (cpu, _) in sample.items()}
        for pid, (_, cmdline) in sample.items():
            self._note_affinity(pid, cmdline)
        self._thread = threading.Thread(target=self._run, name="child-cpu", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self._update(final=True)
        seconds: Dict[str, float] = {}
        for pid, (cpu, cmdline) in self._last.items():
            role = _role(cmdline)
            seconds[role] = seconds.get(role, 0.0) + cpu - self._start.get(pid, 0.0)
        self.seconds = seconds
