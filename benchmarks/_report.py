"""Shared helpers for every benchmark script: the ``--json FILE`` option, the choice of broker
(``--broker``/``--bmqbrkr``/``--cluster``) and the broker processes, an aligned table on stdout
and a JSON record of the results together with the machine they were measured on."""
from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import itertools
import json
import os
import platform
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import AbstractSet, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

#: Whether the official ``blazingmq`` SDK is installed (the scripts comparing bmq with it
#: import it only then, and refuse to compare without it).
HAVE_OFFICIAL = importlib.util.find_spec("blazingmq") is not None


def make_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark understands.

    Args:
        description: one line saying what the benchmark measures.

    Returns:
        A parser with ``--json FILE``; scripts may add their own options.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    return parser


def cpu_model() -> str:
    """The CPU model name (from /proc/cpuinfo where available)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def idle_regime() -> str:
    """How this machine's idle CPUs wait, where Linux says (else ""): under a hypervisor's
    ``haltpoll`` idle driver with ``guest_halt_poll_ns=0`` an idle vCPU halts at once, and waking
    a thread there costs tens of microseconds. A blocking post's round trip then depends on
    whether the broker's CPU had time to halt: the bare-socket floor, which sends its next PUT
    at once, measured twice as slow with the knob at 0 as at the kernel's default 200000."""
    try:
        driver = Path("/sys/devices/system/cpu/cpuidle/current_driver").read_text().strip()
    except OSError:
        return ""
    try:
        poll_ns = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns").read_text().strip()
    except OSError:
        return f"cpuidle {driver}"
    return f"cpuidle {driver}, guest_halt_poll_ns={poll_ns}"


def machine_info() -> Dict[str, Any]:
    """CPU model, core count, idle regime, Python version, platform and the current UTC date."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "idle": idle_regime(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def best_time(func: Callable[[], Any], repeat: int = 5) -> float:
    """The fastest of ``repeat`` wall-clock runs of ``func``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - start)
    return best


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows as an aligned text table (numbers right-aligned, floats to 3 significant places)."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    text: List[List[str]] = [list(headers)] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(text):
        parts = [v.rjust(w) if numeric[i] and n else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    results: Mapping[str, Any],
    json_path: Optional[str],
) -> None:
    """Print the table (and machine line); write ``results`` + machine info to ``json_path``.

    Args:
        title: heading printed above the table.
        headers: column names.
        rows: table rows.
        results: the machine-readable numbers (flat mapping of name to value).
        json_path: where to write the JSON record, or None.
    """
    info = machine_info()
    idle = f" ({info['idle']})" if info["idle"] else ""
    print(f"{title}\n{info['cpu']}, {info['cores']} cores{idle}, Python {info['python']}, {info['date']}\n")
    print(format_table(headers, rows))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump({"benchmark": title, "machine": info, "results": dict(results)}, f, indent=2)
            f.write("\n")


def process_cpu_seconds(pid: int) -> float:
    """User+system CPU seconds process ``pid`` has used so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pinned_to(cpus: Optional[AbstractSet[int]]) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that confines the child, and so every
    process and thread it starts (they inherit the mask), to the CPUs ``cpus``; None for no
    confinement. Set in the child before it runs anything, so no thread of it escapes."""
    if cpus is None:
        return None
    chosen = frozenset(cpus)
    return lambda: os.sched_setaffinity(0, chosen)


class BrokerProcess:
    """The embedded broker in a child process (``python -m bmq.broker --port 0``), importing
    the same bmq as this script; ``address``, ``port`` and ``cpu_seconds()`` for the figures.
    ``cpus``: the CPUs it may run on (see :func:`pinned_to`; default: this process's)."""

    name = "embedded broker (own process)"

    def __init__(self, extra_args: Sequence[str] = (), cpus: Optional[AbstractSet[int]] = None) -> None:
        import bmq

        root = str(Path(bmq.__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([sys.executable, "-m", "bmq.broker", "--port", "0", *extra_args], cwd=root,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                     preexec_fn=pinned_to(cpus))
        # Bounded: a broker stuck before its banner must not hang the benchmark.
        stdout = self.proc.stdout
        assert stdout is not None
        banner = stdout.readline() if select.select([stdout], [], [], 60.0)[0] else ""
        if "tcp://" not in banner:
            self.stop()
            raise RuntimeError(f"broker did not start within 60 s: {banner!r}")
        self.address = banner.split()[4]
        self.port = int(self.address.rsplit(":", 1)[1])

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ExternalBroker(BrokerProcess):
    """A broker this script did not start (``--broker ADDR``): its address only; its CPU is
    not measured."""

    name = "external broker"

    def __init__(self, address: str) -> None:  # noqa: D107 - no process of ours
        self.address = address

    def cpu_seconds(self) -> float:
        return 0.0

    def stop(self) -> None:
        pass


def measure(broker: BrokerProcess, run: Callable[[], Optional[Dict[str, float]]], count: int) -> Dict[str, float]:
    """Throughput and CPU per message of the client (this process) and of the broker, while
    ``run()`` handles ``count`` messages; what ``run`` returns (latencies, say) is added."""
    client0, broker0, t0 = time.process_time(), broker.cpu_seconds(), time.perf_counter()
    extra = run() or {}
    elapsed = time.perf_counter() - t0
    return {
        "msgs_per_s": count / elapsed,
        "client_cpu_us_per_msg": (time.process_time() - client0) / count * 1e6,
        "broker_cpu_us_per_msg": (broker.cpu_seconds() - broker0) / count * 1e6,
        **extra,
    }


def medians(runs: Mapping[str, Sequence[Mapping[str, float]]]) -> Dict[str, Dict[str, float]]:
    """The median of every figure of each client's runs (``{client: [figures of one run, ...]}``,
    every run of a client with the same keys), by client."""
    return {name: {key: statistics.median(run[key] for run in done) for key in done[0]}
            for name, done in runs.items()}


class RealBrokerProcess(BrokerProcess):
    """The real bmqbrkr from ``../shared/bmqbrkr`` (or ``home``) on a free port, fresh directory;
    ``cpus``: the CPUs it may run on (see :func:`pinned_to`; default: this process's)."""

    name = "bmqbrkr"

    def __init__(self, home: Path, cpus: Optional[AbstractSet[int]] = None) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{self.port}"
        self._dir = tempfile.mkdtemp(prefix="bmqbrkr-bench-")
        self.proc = subprocess.Popen([str(home / "run"), "--port", str(self.port), "--dir", self._dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                     preexec_fn=pinned_to(cpus))
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"bmqbrkr did not start (see {self._dir}/logs)")
                time.sleep(0.05)

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self._dir, ignore_errors=True)


class ClusterProcess(BrokerProcess):
    """A BlazingMQ cluster as production runs it: ``nodes`` bmqbrkr nodes and a proxy on
    127.0.0.1, started by ``home/run-cluster`` in a fresh directory; ``address`` is the proxy's.
    Its CPU is that of every broker (the proxy forwards, the primary stores and replicates, the
    replicas store). A multi-node cluster serves only the persistent (and broadcast) domains."""

    name = "bmqbrkr cluster (3 nodes + proxy)"
    domain = "bmq.test.persistent.priority"

    def __init__(self, home: Path, nodes: int = 3) -> None:
        self._run = str(home / "run-cluster")
        self._dir = tempfile.mkdtemp(prefix="bmqcluster-bench-")
        base = _free_port_range(nodes + 1)
        subprocess.run([self._run, "--nodes", str(nodes), "--base-port", str(base), "--dir", f"{self._dir}/c"],
                       check=True, stdout=subprocess.DEVNULL, timeout=120)
        env = dict(line.split("=", 1) for line in Path(f"{self._dir}/c/cluster.env").read_text().split()
                   if "=" in line)
        self._pids = [int(value) for key, value in env.items() if key.endswith("_PID")]
        self.port = int(env["PROXY_PORT"])
        self.address = f"tcp://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        return sum(process_cpu_seconds(pid) for pid in self._pids)

    def stop(self) -> None:
        subprocess.run([self._run, "--stop", f"{self._dir}/c"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)
        shutil.rmtree(self._dir, ignore_errors=True)


def _free_port_range(count: int) -> int:
    """The first of ``count`` consecutive ports on 127.0.0.1 that nothing listens on now."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        taken = False
        for port in range(base + 1, base + count):
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    taken = True
                    break
        if not taken:
            return base


def default_bmqbrkr_home() -> Path:
    """``../shared/bmqbrkr`` beside the checkout this script is in."""
    return Path(__file__).resolve().parents[2] / "shared" / "bmqbrkr"


def add_broker_options(parser: argparse.ArgumentParser, *, cluster: bool = False) -> None:
    """Add the choice of broker, at most one of ``--broker ADDR`` and ``--bmqbrkr [HOME]`` (and,
    with ``cluster``, ``--cluster [HOME]``); without any, the embedded broker in its own process.
    :func:`broker_starter` turns the parsed choice into brokers."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--broker", help="an already running broker's address (its CPU is not measured)")
    where.add_argument("--bmqbrkr", nargs="?", const=str(default_bmqbrkr_home()), metavar="HOME",
                       help="start the real bmqbrkr (default HOME: ../shared/bmqbrkr beside the checkout)")
    if cluster:
        where.add_argument("--cluster", nargs="?", const=str(default_bmqbrkr_home()), metavar="HOME",
                           help="start a 3-node bmqbrkr cluster with a proxy (HOME/run-cluster) and go through the "
                                "proxy, on the persistent domain (replicated ACKs)")


def broker_starter(args: argparse.Namespace,
                   cpus: Optional[AbstractSet[int]] = None) -> Tuple[str, Callable[[], BrokerProcess]]:
    """The broker chosen by the options of :func:`add_broker_options`: its name (an external
    broker's address) and what starts a fresh one each time it is called, on ``cpus`` (see
    :func:`pinned_to`; only for one broker this script starts).

    Raises:
        ValueError: ``cpus`` for an external broker or a cluster.
    """
    if cpus is not None and (args.broker or getattr(args, "cluster", None)):
        raise ValueError("CPUs are chosen only for a single broker this script starts")
    if args.broker:
        return args.broker, functools.partial(ExternalBroker, args.broker)
    if getattr(args, "cluster", None):
        return ClusterProcess.name, functools.partial(ClusterProcess, Path(args.cluster))
    if args.bmqbrkr:
        return RealBrokerProcess.name, functools.partial(RealBrokerProcess, Path(args.bmqbrkr), cpus=cpus)
    return BrokerProcess.name, functools.partial(BrokerProcess, cpus=cpus)


def fill_queue(address: str, uri: str, count: int, payload: bytes, chunk: int = 10_000, options: Any = None) -> None:
    """Post ``count`` copies of ``payload`` to ``uri`` with bmq (``options``: its
    ``bmq.SessionOptions``); returns once every one is ACKed."""
    import bmq

    with bmq.Session(address, options) as session:
        queue = session.open_queue(uri, write=True)
        for first in range(0, count, chunk):
            queue.post_many([payload] * min(chunk, count - first))  # raises unless all SUCCESS


def drain_in_batches(session: Any, queue: Any, count: int, batch: int) -> None:
    """Take ``count`` messages from ``queue`` with ``messages()`` and confirm each batch with one
    ``confirm_many`` (bmq's fastest way to consume with a Message object per message; without
    one, see :func:`drain_batches`)."""
    received = 0
    while received < count:
        messages = list(itertools.islice(queue.messages(timeout=30.0), batch))
        if not messages:
            raise RuntimeError(f"consumer stalled at {received}/{count}")
        session.confirm_many(messages)
        received += len(messages)


def drain_batches(queue: Any, count: int, batch: int) -> None:
    """Take ``count`` messages from ``queue`` (opened with ``batches=True``) with ``get_batch``
    of at most ``batch`` messages, confirming each :class:`bmq.MessageBatch` whole (no Python
    object per message: bmq's fastest way to consume)."""
    received = 0
    while received < count:
        messages = queue.get_batch(batch, timeout=30.0)
        if messages is None:
            raise RuntimeError(f"batch consumer stalled at {received}/{count}")
        messages.confirm()
        received += len(messages)
