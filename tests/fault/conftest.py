"""Fixtures of the fault tests: a broker with a fast heartbeat, so dead links show up quickly."""
from __future__ import annotations

import pytest

from bmq.broker import Broker


@pytest.fixture
def broker():
    """A fresh embedded broker (heartbeat every 100 ms, 5 missed = dead) per test."""
    with Broker(heartbeat_interval_ms=100, max_missed_heartbeats=5) as b:
        yield b


@pytest.fixture(params=["embedded", "bmqbrkr"])
def broker_address(request) -> str:
    """The address of the embedded broker (fast heartbeats, above) or of the shared bmqbrkr."""
    if request.param == "embedded":
        return request.getfixturevalue("broker").address
    return request.getfixturevalue("bmqbrkr").address
