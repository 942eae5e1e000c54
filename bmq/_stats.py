"""Session statistics: counters kept where the state already is, and snapshots of them.

Counting stays off the hot path's cost: each counter is a plain integer attribute incremented
by the thread that already owns that state, under the lock it already holds (the pending-PUT
table's for posts and answers, the reader thread for PUSHes and received bytes); nothing new is
locked. Post→ACK latencies are kept in a ring of the last :data:`LATENCY_WINDOW` samples (one
per post call answered in one ACK event: its messages share the post and the answer time) and
turned into percentiles only when a snapshot is taken. A ``confirm_many`` interrupted by a lost
connection counts none of its confirms (the broker redelivers those messages).

Invariant of a queue's figures (also after reconnects and faults):
``posted == acked[SUCCESS] + sum(other answers) + in_flight`` — every posted message is either
answered (by the broker, or locally: TIMEOUT, CANCELED, NOT_CONNECTED) or still in flight.
"""
from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import _codec
from ._types import ACK_STATUS_FROM_WIRE

if TYPE_CHECKING:  # pragma: no cover
    from ._transport import Transport

__all__ = ["QueueCounters", "QueueStats", "SessionStats", "LATENCY_WINDOW"]

#: How many of the latest post→ACK latencies the percentiles are taken over.
LATENCY_WINDOW = 4096


class QueueCounters:
    """Live counters of one queue (see the module docstring for who increments what)."""

    __slots__ = ("posted", "posted_bytes", "broker_answers", "local_answers", "pushed", "confirmed", "latencies")

    def __init__(self) -> None:
        self.posted = 0
        self.posted_bytes = 0
        # Broker ACKs by wire status (a list: the reader's per-message cost is one index), and
        # the rarer local answers by AckStatus name.
        self.broker_answers: List[int] = [0] * 16
        self.local_answers: Dict[str, int] = {}
        self.pushed = 0
        self.confirmed = 0
        self.latencies = _codec.SampleRing(LATENCY_WINDOW)  # 32 KB once the queue posts

    def snapshot(self, uri: str) -> "QueueStats":
        acked = dict(self.local_answers)
        for code, count in enumerate(self.broker_answers):
            if count:
                name = ACK_STATUS_FROM_WIRE[code].name
                acked[name] = acked.get(name, 0) + count
        answered = sum(acked.values())
        return QueueStats(
            uri=uri,
            posted=self.posted,
            posted_bytes=self.posted_bytes,
            acked=acked,
            in_flight=self.posted - answered,
            pushed=self.pushed,
            confirmed=self.confirmed,
            unconfirmed=max(0, self.pushed - self.confirmed),
            ack_latency_us=_percentiles(self.latencies.values()),
        )


def _percentiles(samples: List[float]) -> Dict[str, float]:
    if not samples:
        return {}
    samples.sort()
    pick = lambda q: round(samples[min(len(samples) - 1, int(q * len(samples)))] * 1e6, 1)  # noqa: E731
    return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99), "max": round(samples[-1] * 1e6, 1)}


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """One queue's figures at the time of the snapshot.

    Attributes:
        uri: the queue's URI.
        posted, posted_bytes: messages (and payload bytes) handed to the broker by this session.
        acked: final answers by :class:`bmq.AckStatus` name (``"SUCCESS"``, NACKs, and the local
            ``"TIMEOUT"``, ``"CANCELED"``, ``"NOT_CONNECTED"``).
        in_flight: posted and not answered yet.
        pushed, confirmed, unconfirmed: messages delivered to this reader, confirmed, and not yet.
        ack_latency_us: post→ACK percentiles (``p50``, ``p90``, ``p99``, ``max``) over the latest
            broker answers, one sample per post call per ACK event (empty before the first).
    """

    uri: str
    posted: int
    posted_bytes: int
    acked: Dict[str, int]
    in_flight: int
    pushed: int
    confirmed: int
    unconfirmed: int
    ack_latency_us: Dict[str, float]


@dataclasses.dataclass(frozen=True)
class SessionStats:
    """A session's figures at the time of the snapshot (:meth:`bmq.Session.stats`).

    Attributes:
        broker: the broker address.
        state: the session state (a ``bmq.SessionState`` value).
        connections: connections established so far; ``reconnects`` is that minus one.
        bytes_in, bytes_out, events_in: traffic of the current connection (events out are
            coalesced by the writer and not counted).
        writer_queue_bytes: bytes waiting for the socket now.
        high_watermark_wait_s: seconds posters spent waiting above the high watermark (all
            connections).
        outbox_messages: messages in the durable outbox (0 without one).
        queues: per queue URI, its :class:`QueueStats`.
    """

    broker: str
    state: str
    connections: int
    reconnects: int
    bytes_in: int
    bytes_out: int
    events_in: int
    writer_queue_bytes: int
    high_watermark_wait_s: float
    outbox_messages: int
    queues: Dict[str, QueueStats]

    @classmethod
    def of(cls, broker: str, state: str, connections: int, transport: Optional["Transport"], outbox_messages: int,
           queues: Dict[str, QueueStats]) -> "SessionStats":
        """The snapshot of a session whose current connection's transport is ``transport``
        (None while disconnected: no traffic to report)."""
        t = transport
        return cls(broker=broker, state=state, connections=connections, reconnects=max(0, connections - 1),
                   bytes_in=t.bytes_in if t else 0, bytes_out=t.bytes_out if t else 0,
                   events_in=t.events_in if t else 0, writer_queue_bytes=t._queued if t else 0,
                   high_watermark_wait_s=round(t.high_watermark_wait, 6) if t else 0.0,
                   outbox_messages=outbox_messages, queues=queues)

    def as_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dict of everything."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """:meth:`as_dict` as a JSON document (keys sorted)."""
        return json.dumps(self.as_dict(), sort_keys=True)

    def table(self) -> str:
        """A readable report: one line for the session, one per queue."""
        lines = [
            f"session to {self.broker} ({self.state}): connections {self.connections}, reconnects {self.reconnects}, "
            f"in {self.events_in:,} events / {self.bytes_in:,} B, out {self.bytes_out:,} B, writer queue {self.writer_queue_bytes:,} B, high-watermark waits "
            f"{self.high_watermark_wait_s:.3f} s, outbox {self.outbox_messages:,}",
            f"{'queue':<48} {'posted':>10} {'acked':>10} {'nacked':>8} {'in flight':>9} {'pushed':>10} "
            f"{'confirmed':>10} {'p50 us':>8} {'p99 us':>8}",
        ]
        for uri, q in sorted(self.queues.items()):
            success = q.acked.get("SUCCESS", 0)
            lines.append(
                f"{uri:<48} {q.posted:>10,} {success:>10,} {sum(q.acked.values()) - success:>8,} "
                f"{q.in_flight:>9,} {q.pushed:>10,} {q.confirmed:>10,} "
                f"{_fmt(q.ack_latency_us.get('p50')):>8} {_fmt(q.ack_latency_us.get('p99')):>8}")
        return "\n".join(lines)


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.0f}"
