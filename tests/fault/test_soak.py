"""The soak in short (``benchmarks/soak.py`` runs the same engine, ``tests/endurance.py``, for
minutes): ~35 s of mixed traffic per broker through a fault every 5 s, so that a change which
loses a message, stores one twice, or leaks memory, threads or file descriptors per reconnect
fails here. The thresholds (RSS growth <= 20 MB after the first 10 s; threads and fds back to
their baseline; nothing missing; duplicates only with a fault between their deliveries, errors
only inside a fault's window) hold with a wide margin on a loaded 2-core machine: RSS grows
~2 MB in such a run, and the rates are a fraction of what the client sustains.
"""
from __future__ import annotations

from pathlib import Path

from endurance import SoakConfig, SoakResult, run_soak

SHORT = dict(seconds=35.0, interval=5.0, fault_every=5.0, first_fault=3.0, stall_seconds=2.0, grace=10.0, warmup=10.0)


def _soak(tmp_path: Path, home: "Path | None") -> SoakResult:
    result = run_soak(SoakConfig(bmqbrkr_home=home, workdir=tmp_path, **SHORT))
    print("\n" + result.report())
    return result


def _assert_soaked(result: SoakResult, fault_kinds: set) -> None:
    assert {fault["kind"] for fault in result.faults} == fault_kinds  # every kind of fault came
    streams = result.totals["streams"]
    assert all(stream["acked"] > 0 for stream in streams.values()), streams  # every pattern ran
    assert result.ok, result.report()


def test_soak_embedded_broker(tmp_path, caplog):
    caplog.set_level("ERROR", logger="bmq")  # captured reconnect logs would be memory growth of the test's
    _assert_soaked(_soak(tmp_path, None), {"cut", "stall", "restart", "reopen", "drop", "withhold"})


def test_soak_bmqbrkr(tmp_path, caplog, bmqbrkr_home):
    caplog.set_level("ERROR", logger="bmq")
    _assert_soaked(_soak(tmp_path, bmqbrkr_home), {"cut", "stall", "crash", "reopen"})
