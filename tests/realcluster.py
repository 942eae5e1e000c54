"""A real multi-node BlazingMQ cluster (``../shared/bmqbrkr/run-cluster``) as a test peer.

``run-cluster`` starts N ``bmqbrkr`` nodes and M proxy brokers on 127.0.0.1, each in its own
directory, and answers ``--status`` from the brokers' logs (alive, AVAILABLE, the leader each
node saw become ACTIVE, the ACTIVE primary of each partition); see
``../shared/bmqbrkr/cluster/README.md``. :class:`RealCluster` wraps it for tests, as
:class:`realbroker.RealBroker` wraps the single broker: start on a free port range, kill and
restart one broker, and wait (polling the status, with a deadline) until the cluster is whole
again. With ``E_LEADER_IS_MASTER_ALL`` the leader is the primary of every partition, i.e. of
every queue.

A multi-node cluster serves only ``bmq.test.persistent.*`` and ``bmq.test.mem.broadcast``:
opening ``bmq.test.mem.priority``/``.fanout`` on it crashes the primary (bmqbrkr v0.95.14).
"""
from __future__ import annotations

import dataclasses
import os
import random
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

#: How long ``run-cluster`` may take to bring the whole cluster up (usually 6-8 s).
START_TIMEOUT = 90.0
#: How long a restarted node may take to be AVAILABLE again (usually 1.5-4 s, more when loaded).
RESTART_TIMEOUT = 60.0
#: Base ports are drawn below Linux's ephemeral range (32768-60999), so that no outgoing
#: connection holds a node's port while the node is down.
PORT_RANGE = (20_000, 32_000)
#: Polling interval of the cluster's status (each poll runs ``run-cluster --status``, ~30 ms).
POLL = 0.2


class ClusterError(RuntimeError):
    """``run-cluster`` failed, or the cluster did not reach a state in time."""


@dataclasses.dataclass(frozen=True)
class BrokerStatus:
    """One line of ``run-cluster --status``. For a proxy only name, port, pid and alive are
    known; for a node ``available``/``leader``/``primaries`` are read from its current log
    (``leader`` is None while it has seen none; ``primaries`` has one name or None per
    partition)."""

    name: str
    port: int
    pid: int
    alive: bool
    available: bool = False
    leader: Optional[str] = None
    primaries: Tuple[Optional[str], ...] = ()

    @property
    def is_node(self) -> bool:
        return self.name.startswith("node")


@dataclasses.dataclass(frozen=True)
class ClusterStatus:
    """Every broker's :class:`BrokerStatus`, by name."""

    brokers: Dict[str, BrokerStatus]

    @property
    def nodes(self) -> List[BrokerStatus]:
        return [b for b in self.brokers.values() if b.is_node]

    def agreed_leader(self) -> Optional[str]:
        """The node every live node sees as ACTIVE leader and ACTIVE primary of every
        partition, when that node is alive too; None otherwise (say, during an election)."""
        live = [node for node in self.nodes if node.alive]
        leaders = {node.leader for node in live}
        if len(leaders) != 1:
            return None
        leader = leaders.pop()
        if leader is None or not self.brokers[leader].alive:
            return None
        if any(primary != leader for node in live for primary in node.primaries):
            return None
        return leader

    def problems(self) -> List[str]:
        """Why the cluster is not healthy (empty when healthy): every broker alive, every node
        AVAILABLE, one leader seen by all and primary of every partition."""
        found = [f"{b.name} is dead" for b in self.brokers.values() if not b.alive]
        found += [f"{n.name} is not AVAILABLE" for n in self.nodes if n.alive and not n.available]
        if self.agreed_leader() is None:
            found.append("no leader agreed as leader and primary: " + ", ".join(
                f"{n.name}->{n.leader}/{','.join(map(str, n.primaries))}" for n in self.nodes))
        return found

    def __str__(self) -> str:
        return "; ".join(
            f"{b.name}:{'up' if b.alive else 'DEAD'}"
            + (f" avail={'y' if b.available else 'n'} leader={b.leader} prim={','.join(map(str, b.primaries))}"
               if b.is_node else "")
            for b in self.brokers.values())


def _ports_free(first: int, count: int) -> bool:
    """Whether nothing holds any of ``first..first+count-1`` on 127.0.0.1 (each can be bound)."""
    for port in range(first, first + count):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _gone(pid: int) -> bool:
    """The process exited (a zombie, killed but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class RealCluster:
    """A cluster of ``nodes`` bmqbrkr nodes (``node1``...) and ``proxies`` proxy brokers
    (``proxy``, ``proxy2``...) run by ``run-cluster`` in ``directory``.

    Args:
        home: ``../shared/bmqbrkr`` (holds ``run-cluster``).
        directory: a directory for the cluster (created; must not hold a previous cluster).
        nodes, proxies: how many of each.
        base_port: the proxy's port P (nodes on P+1..P+N, proxy2.. after them); default: a
            free range drawn at random, P..P+N+M free on 127.0.0.1.

    Thread-safety: one test thread drives it; :meth:`status` may be called from any thread.
    """

    def __init__(self, home: Path, directory: Path, *, nodes: int = 3, proxies: int = 2,
                 base_port: Optional[int] = None) -> None:
        self.script = Path(home) / "run-cluster"
        self.directory = Path(directory)
        self.node_count = nodes
        self.proxy_count = proxies
        self.base_port = base_port
        self._env: Dict[str, str] = {}
        self.restarts: List[str] = []  # names restarted by ensure_healthy (a test left them dead)

    # ---- life ----------------------------------------------------------------------------
    def launch(self, attempts: int = 3) -> "RealCluster":
        """Start the whole cluster; return once it serves (``run-cluster`` waits for that).
        With a drawn base port, a failed start (say, another test run took a port meanwhile)
        is tried again on another range, in a new directory."""
        span = self.node_count + self.proxy_count + 1  # P..P+N+M: one port of margin
        errors = []
        for attempt in range(attempts if self.base_port is None else 1):
            port = self.base_port or self._draw_base_port(span)
            directory = self.directory.with_name(f"{self.directory.name}-{attempt}") if attempt else self.directory
            result = self._run("--nodes", str(self.node_count), "--proxies", str(self.proxy_count),
                               "--base-port", str(port), "--dir", str(directory), "--timeout", str(int(START_TIMEOUT)),
                               timeout=START_TIMEOUT + 30)
            if result.returncode == 0:
                self.directory, self.base_port = directory, port
                self._read_env()
                return self
            errors.append(f"base port {port}, exit {result.returncode}:\n{result.stderr[-2000:]}")
        raise ClusterError("run-cluster failed:\n" + "\n".join(errors))

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every broker (SIGTERM, SIGKILL after ``timeout``). Idempotent."""
        if (self.directory / "cluster.env").exists():
            self._run("--stop", str(self.directory), "--timeout", str(int(timeout)), timeout=timeout + 30)

    def __enter__(self) -> "RealCluster":
        return self.launch()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---- addresses -----------------------------------------------------------------------
    @property
    def nodes(self) -> List[str]:
        return [f"node{i}" for i in range(1, self.node_count + 1)]

    @property
    def proxies(self) -> List[str]:
        return ["proxy"] + [f"proxy{i}" for i in range(2, self.proxy_count + 1)]

    def port(self, name: str) -> int:
        return int(self._var(name, "PORT"))

    def pid(self, name: str) -> int:
        self._read_env()  # run-cluster --start rewrites it
        return int(self._var(name, "PID"))

    @property
    def proxy_address(self) -> str:
        return f"tcp://127.0.0.1:{self.port('proxy')}"

    @property
    def proxy2_address(self) -> str:
        return f"tcp://127.0.0.1:{self.port('proxy2')}"

    def node_address(self, name: str) -> str:
        if name not in self.nodes:
            raise ValueError(f"no node {name!r}: {self.nodes}")
        return f"tcp://127.0.0.1:{self.port(name)}"

    # ---- state ---------------------------------------------------------------------------
    def status(self) -> ClusterStatus:
        """The cluster as ``run-cluster --status`` sees it now."""
        result = self._run("--status", str(self.directory), timeout=30)
        if result.returncode != 0:
            raise ClusterError(f"run-cluster --status failed:\n{result.stderr}")
        brokers: Dict[str, BrokerStatus] = {}
        for line in result.stdout.splitlines():
            name, *pairs = line.split()
            fields = dict(pair.split("=", 1) for pair in pairs)
            brokers[name] = BrokerStatus(
                name=name, port=int(fields["port"]), pid=int(fields["pid"] or 0),
                alive=fields["alive"] == "yes", available=fields.get("available") == "yes",
                leader=None if fields.get("leader", "-") == "-" else fields["leader"],
                primaries=tuple(None if p == "-" else p for p in fields.get("primaries", "").split(",") if p))
        return ClusterStatus(brokers)

    def leader(self, timeout: float = 30.0) -> str:
        """The current leader, which is the primary of every partition, as the cluster itself
        reports it through admin commands (``bmq.Admin.cluster_status`` of every live node):
        the node every live node names ACTIVE leader and ACTIVE primary of every partition;
        waits up to ``timeout`` while an election is under way."""
        deadline = time.monotonic() + timeout
        while True:
            views = self._admin_views()
            leaders = set(views.values())
            if views and None not in leaders and len(leaders) == 1:
                (leader,) = leaders
                assert leader is not None
                if leader in views:
                    return leader
            if time.monotonic() > deadline:
                raise ClusterError(f"no leader agreed by every live node within {timeout} s: {views}")
            time.sleep(POLL)  # polling the nodes' views: an election signals nothing to wait on

    def _admin_views(self) -> Dict[str, Optional[str]]:
        """Per live node: the node it names ACTIVE leader and ACTIVE primary of every partition
        (``CLUSTERS CLUSTER local STATUS``), or None (no such leader yet, or no answer)."""
        import bmq  # the client under test: only where the cluster is asked through it

        alive = {name for name, broker in self.status().brokers.items() if broker.alive}
        views: Dict[str, Optional[str]] = {}
        for name in self.nodes:
            if name not in alive:
                continue
            try:
                with bmq.Admin(self.node_address(name), timeout=5.0) as admin:
                    status = admin.cluster_status("local")
            except bmq.Error:
                views[name] = None
                continue
            agreed = (status.leader is not None and status.leader_status == "ACTIVE" and status.partitions
                      and all(p.primary == status.leader and p.primary_status == "ACTIVE" for p in status.partitions))
            views[name] = status.leader if agreed else None
        return views

    def logged_leader(self, timeout: float = 30.0) -> str:
        """The leader as the brokers' logs say (``run-cluster --status``): the live node every
        live node saw become ACTIVE leader and primary; waits up to ``timeout``. What the admin
        answers are checked against."""
        status = self._wait(lambda s: s.agreed_leader() is not None, timeout, "a leader agreed by all live nodes")
        leader = status.agreed_leader()
        assert leader is not None
        return leader

    def replica(self, timeout: float = 30.0) -> str:
        """A live node that is not the leader."""
        leader = self.leader(timeout)
        return next(name for name in self.nodes if name != leader)

    def wait_healthy(self, timeout: float = RESTART_TIMEOUT) -> ClusterStatus:
        """Wait until every broker is alive, every node AVAILABLE, and all nodes agree on one
        leader that is the ACTIVE primary of every partition; ClusterError after ``timeout``."""
        return self._wait(lambda s: not s.problems(), timeout, "a healthy cluster")

    def ensure_healthy(self, timeout: float = RESTART_TIMEOUT) -> List[str]:
        """Restart every dead broker, then :meth:`wait_healthy`; return the names restarted."""
        status = self.status()  # a status costs ~0.1 s, ~1 s on a loaded machine: ask once if all is well
        dead = [b.name for b in status.brokers.values() if not b.alive]
        for name in dead:
            self._start_one(name)
        self.restarts += dead
        if dead or status.problems():
            self.wait_healthy(timeout)
        return dead

    def proxy_upstream(self, proxy: str = "proxy") -> Optional[str]:
        """The node ``proxy`` last chose as its active node (from its current log; None before
        a client opened a queue through it: a proxy connects lazily, to a node at random)."""
        pid = self.pid(proxy)
        log = next((self.directory / proxy / "logs").glob(f"logs.*.{pid}"), None)
        if log is None:
            return None
        found = re.findall(r"using node '\[(\w+), \d+\]' as active", log.read_text(errors="replace"))
        return found[-1] if found else None

    # ---- faults --------------------------------------------------------------------------
    def kill(self, name: str) -> int:
        """SIGKILL one broker (a crash); return once it is gone; return its pid."""
        pid = self.pid(name)
        if not self._is_ours(pid, name):
            raise ClusterError(f"{name} (pid {pid}) is not running")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not _gone(pid):
            if time.monotonic() > deadline:
                raise ClusterError(f"{name} (pid {pid}) still there 10 s after SIGKILL")
            time.sleep(0.01)  # polling /proc: a process that is not our child has nothing to wait on
        return pid

    def start(self, name: str, timeout: float = RESTART_TIMEOUT) -> None:
        """Start one (dead) broker again on its port and storage; return once it is back: its
        port accepts connections and, for a node, it is AVAILABLE again and agrees on a live
        leader."""
        self._start_one(name)
        if name in self.nodes:
            self._wait(lambda s: s.brokers[name].alive and s.brokers[name].available
                       and s.brokers[name].leader is not None and s.agreed_leader() is not None,
                       timeout, f"{name} AVAILABLE again")

    # ---- internals -----------------------------------------------------------------------
    def _start_one(self, name: str) -> None:
        result = self._run("--start", name, "--dir", str(self.directory), timeout=60)
        if result.returncode != 0 and not self._listens_soon(name):
            raise ClusterError(f"run-cluster --start {name} failed:\n{result.stderr[-2000:]}")
        if not _port_open(self.port(name)):
            raise ClusterError(f"{name} restarted but its port {self.port(name)} refuses connections")

    def _listens_soon(self, name: str, timeout: float = 30.0) -> bool:
        """The restarted ``name`` listens within ``timeout`` although run-cluster said it exited:
        on a loaded machine its check can look at the process while it is still being exec'd
        (seen once in CI: "exited before listening", with no output of the new run at all)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _port_open(self.port(name)):
                return True
            time.sleep(0.2)  # polling a port that is not open yet: nothing to wait on
        return False

    def _is_ours(self, pid: int, name: str) -> bool:
        """``pid`` is a live bmqbrkr run from this cluster's ``name`` directory (never signal a
        process that merely reused a dead broker's pid)."""
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
        return "bmqbrkr.tsk" in command and str(self.directory / name / "etc") in command and not _gone(pid)

    def _wait(self, condition, timeout: float, what: str) -> ClusterStatus:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if condition(status):
                return status
            if time.monotonic() > deadline:
                raise ClusterError(f"no {what} within {timeout} s: {status}; problems: {status.problems()}")
            time.sleep(POLL)  # polling the brokers' logs: they signal nothing to wait on

    def _draw_base_port(self, span: int) -> int:
        for _ in range(200):
            port = random.randrange(PORT_RANGE[0], PORT_RANGE[1] - span)
            if _ports_free(port, span):
                return port
        raise ClusterError(f"no {span} free consecutive ports found in {PORT_RANGE}")

    def _read_env(self) -> None:
        env = {}
        for line in (self.directory / "cluster.env").read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                env[key] = value
        self._env = env

    def _var(self, name: str, what: str) -> str:
        key = f"{name.upper()}_{what}"
        if key not in self._env:
            raise KeyError(f"no {key} in {self.directory / 'cluster.env'} (no broker {name!r}?)")
        return self._env[key]

    def _run(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.script), *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def __repr__(self) -> str:
        return f"<RealCluster {self.node_count} nodes + {self.proxy_count} proxies, P={self.base_port} " \
               f"dir={self.directory}>"
