"""The soak's duplicates and stalls checks (``tests/endurance.py``) on synthetic timelines.

BlazingMQ delivers at least once: a message comes again only after its consumer's connection
or session went away (or the broker restarted) before its confirmation was in, or after the
client sent its PUT again on a reconnect. So a duplicate is explained by a fault between its
two deliveries, or during its PUT, however late it comes; one with neither is a finding. A
pattern that stops while the others move is stalled; all of them stopping at once is the
machine only if the soak's own sampler was held up too. ``benchmarks/soak.py --analyse``
judges a saved run again the same way.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import endurance
from endurance import CONNECTION_LOST, RESENT, Ledger, _payload, judge_duplicates, judge_stalls

ROOT = Path(__file__).resolve().parents[2]


def _ledger() -> "tuple[Ledger, endurance._Stream]":
    ledger = Ledger()
    return ledger, ledger.add("s", "post", False, ("r",), capacity=1000)


def _post(ledger: Ledger, stream: "endurance._Stream", count: int = 1) -> List[int]:
    """``count`` messages posted and acknowledged at once."""
    seqs = list(stream.take(count))
    ledger.acked(stream, seqs)
    return seqs


def _deliver(ledger: Ledger, stream: "endurance._Stream", seq: int, t: float) -> None:
    ledger.delivered("r", [_payload(stream, seq)], t)


def _judged(ledger: Ledger) -> "tuple[endurance.Check, Dict[str, int]]":
    return judge_duplicates(ledger.duplicates.records(0.0, ledger.streams), len(ledger.duplicates))


def test_a_redelivery_long_after_the_fault_between_its_deliveries_is_explained():
    ledger, stream = _ledger()
    (seq,) = _post(ledger, stream)
    _deliver(ledger, stream, seq, 1.0)
    ledger.fault_began("cut")
    ledger.fault_ended()
    _deliver(ledger, stream, seq, 500.0)  # far past any grace after the cut (a loaded machine)
    check, causes = _judged(ledger)
    assert check.ok, check.detail
    assert causes == {"cut": 1}


def test_a_duplicate_with_no_fault_between_its_deliveries_is_a_finding():
    ledger, stream = _ledger()
    ledger.fault_began("crash")
    ledger.fault_ended()
    (seq,) = _post(ledger, stream)  # posted, acknowledged and delivered after the crash
    _deliver(ledger, stream, seq, 10.0)
    _deliver(ledger, stream, seq, 11.0)  # again, 1 s after the crash's end: no fault between
    check, causes = _judged(ledger)
    assert not check.ok
    assert causes == {"unexplained": 1}
    assert "s:0 to r at 11.0s" in check.detail


def test_a_duplicate_while_a_fault_is_under_way_is_explained_by_it():
    ledger, stream = _ledger()
    (seq,) = _post(ledger, stream)
    ledger.fault_began("reopen")
    _deliver(ledger, stream, seq, 1.0)
    _deliver(ledger, stream, seq, 2.0)  # the session closed and reopened in between
    ledger.fault_ended()
    check, causes = _judged(ledger)
    assert check.ok and causes == {"reopen": 1}, check.detail


def test_a_put_outstanding_during_a_fault_may_come_twice_one_sent_after_may_not():
    ledger, stream = _ledger()
    resent = list(stream.take(1))  # sent before the cut ...
    ledger.fault_began("cut")
    ledger.fault_ended()
    ledger.acked(stream, resent)  # ... acknowledged after it: the client may have sent it again
    (after,) = _post(ledger, stream)  # sent and acknowledged after the cut
    for seq in (resent[0], after):
        _deliver(ledger, stream, seq, 5.0)
        _deliver(ledger, stream, seq, 6.0)  # both copies after the cut
    check, causes = _judged(ledger)
    assert causes == {RESENT: 1, "unexplained": 1}
    assert not check.ok and "s:1 to r at 6.0s" in check.detail


def test_a_consumers_lost_connection_explains_a_redelivery_a_producers_does_not():
    ledger, stream = _ledger()
    first, second = _post(ledger, stream, 2)
    _deliver(ledger, stream, first, 1.0)
    ledger.connection_lost(time.monotonic(), streams=["s"])  # the producer's session
    _deliver(ledger, stream, first, 2.0)
    _deliver(ledger, stream, second, 3.0)
    ledger.connection_lost(time.monotonic(), readers=["r"])  # the consumer's
    _deliver(ledger, stream, second, 4.0)
    records = ledger.duplicates.records(0.0, ledger.streams)
    assert [(r["seq"], r["between"], r["resent"]) for r in records] == [(first, None, False),
                                                                        (second, CONNECTION_LOST, False)]


def test_a_connection_lost_just_after_a_fault_is_that_faults_doing():
    ledger, stream = _ledger()  # a grace of 15 s
    (seq,) = _post(ledger, stream)
    ledger.fault_began("cut")
    ledger.fault_ended()
    _deliver(ledger, stream, seq, 1.0)  # after the cut ...
    ledger.connection_lost(time.monotonic(), readers=["r"])  # ... whose ConnectionLost comes a moment later
    _deliver(ledger, stream, seq, 2.0)
    check, causes = _judged(ledger)
    assert check.ok and causes == {"cut": 1}, check.detail


class _Inbox:
    """A queue's inbox for :class:`endurance._BatchConsumer`: ``get_batch`` returns what was put."""

    def __init__(self) -> None:
        self.payloads: List[bytes] = []

    def get_batch(self, max_messages: int, timeout: float) -> Any:
        taken, self.payloads = self.payloads, []
        return _Batch(taken) if taken else None


class _Batch:
    def __init__(self, payloads: List[bytes]) -> None:
        self.payloads = b"".join(payloads)
        self.offsets = [0]
        for payload in payloads:
            self.offsets.append(self.offsets[-1] + len(payload))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def confirm(self) -> None:
        pass


def test_a_get_batch_reader_lagging_behind_a_lost_connection_has_its_redeliveries_explained():
    soak = endurance._Soak(endurance.SoakConfig(), "tcp://127.0.0.1:1")  # no session is opened here
    stream = soak.ledger.add("s", "post_many", False, ("r",), capacity=1000)
    consumer = endurance._BatchConsumer(soak, {"r": "bmq://bmq.test.mem.priority/soak-checks"})
    inbox = _Inbox()
    consumer.queues = [inbox]
    (seq,) = _post(soak.ledger, stream)
    inbox.payloads.append(_payload(stream, seq))  # received before the loss ...
    consumer.connection_lost(time.monotonic())  # ... whose event comes before the reader took it
    consumer.work(0)
    inbox.payloads.append(_payload(stream, seq))  # the broker's redelivery after the reconnect
    consumer.work(0)
    check, causes = judge_duplicates(soak.ledger.duplicates.records(0.0, soak.ledger.streams), 1)
    assert check.ok and causes == {CONNECTION_LOST: 1}, check.detail


def test_duplicates_past_the_ones_kept_fail_the_check(monkeypatch):
    monkeypatch.setattr(endurance, "MAX_DUPLICATE_RECORDS", 2)
    ledger, stream = _ledger()
    seqs = _post(ledger, stream, 3)
    for seq in seqs:
        _deliver(ledger, stream, seq, 1.0)
    ledger.fault_began("cut")
    ledger.fault_ended()
    for seq in seqs:
        _deliver(ledger, stream, seq, 2.0)
    check, causes = _judged(ledger)
    assert not check.ok
    assert causes == {"cut": 2, "not judged (past the ones kept)": 1}


def _samples(*points: "tuple[float, int, int]") -> List[Dict[str, Any]]:
    """Samples at ``t`` with these cumulative ACK counts of patterns a and b."""
    return [{"t": t, "total": {"a": a, "b": b}, "rss_mb": 40.0} for t, a, b in points]


B_STALLS = _samples((0, 0, 0), (5, 10, 10), (10, 20, 20), (15, 30, 20), (20, 40, 30))
ALL_STOP_ON_TIME = _samples((0, 0, 0), (5, 10, 10), (10, 10, 10), (15, 20, 20))
ALL_STOP_SAMPLER_LATE = _samples((0, 0, 0), (5, 10, 10), (10, 20, 20), (20, 20, 20), (25, 30, 30))


def test_a_pattern_stalled_while_the_others_moved_fails():
    check = judge_stalls(B_STALLS, [], ["a", "b"], grace=15.0, producing_until=100.0)
    assert not check.ok
    assert check.detail == "stalled while the others moved: ['b 10-15s']"


def test_every_pattern_stopped_with_the_soaks_own_sampler_late_is_the_machine():
    check = judge_stalls(ALL_STOP_SAMPLER_LATE, [], ["a", "b"], grace=15.0, producing_until=100.0)
    assert check.ok, check.detail
    assert "the machine, not judged) in 1 intervals: ['10-20s']" in check.detail


def test_every_pattern_stopped_while_the_sampler_ran_on_time_fails_naming_the_fault_before():
    crash = [{"kind": "crash", "start": 1.0, "end": 2.0, "detail": ""}]
    check = judge_stalls(ALL_STOP_ON_TIME, crash, ["a", "b"], grace=2.0, producing_until=100.0)
    assert not check.ok
    assert ("(the broker or bmq as a whole, not the machine) in 1 intervals: ['5-10s (3 s after a crash)']"
            in check.detail)


def test_stalls_in_a_fault_window_or_after_producing_ended_are_not_judged():
    cut = [{"kind": "cut", "start": 11.0, "end": 11.5, "detail": ""}]
    assert judge_stalls(B_STALLS, cut, ["a", "b"], grace=3.0, producing_until=100.0).ok
    assert judge_stalls(B_STALLS, [], ["a", "b"], grace=3.0, producing_until=10.0).ok


def _analyse(tmp_path: Path, run: Dict[str, Any]) -> str:
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(run))
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--analyse", str(path)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_analyse_judges_a_saved_run_again(tmp_path):
    records = [{"t": 700.0, "stream": "post0", "reader": "callback", "seq": 7, "between": "cut", "resent": False},
               {"t": 800.0, "stream": "post0", "reader": "callback", "seq": 9, "between": None, "resent": False}]
    run = {"seconds": 30.0, "samples": B_STALLS, "faults": [], "checks": [],
           "totals": {"duplicates": 2, "duplicate_records": records, "grace": 15.0, "producing_until": 30.0}}
    out = _analyse(tmp_path, run)
    assert "[FAILED] duplicates explained by faults: 2 duplicates: {'cut': 1, 'unexplained': 1}" in out
    assert "post0:9 to callback at 800.0s" in out
    assert "[FAILED] no stall outside a fault window but the machine's: stalled while the others moved: " \
           "['b 10-15s']" in out


def test_analyse_of_a_run_without_the_evidence_says_what_is_missing(tmp_path):
    run = {"seconds": 30.0, "samples": ALL_STOP_SAMPLER_LATE, "faults": [],
           "checks": [{"name": "duplicates explained by faults", "ok": False, "detail": "..."}],
           "totals": {"duplicates": 5, "duplicates_by_fault": {"cut": 3, "unexplained": 2}}}
    out = _analyse(tmp_path, run)
    assert "[not re-judged] duplicates" in out and "totals.duplicate_records" in out
    assert "its own verdict: FAILED" in out
    assert "[ok] no stall outside a fault window but the machine's: every pattern at once with the soak's " \
           "process held up too" in out
