"""Shared test fixtures.

``../shared`` (protocol vectors and captures) sits beside the project checkout in the
development and CI set-up. In a user's clone it is absent: tests that need it skip with
the reason; under CI (``CI=true``) its absence fails them instead. The same holds for the
real broker, ``../shared/bmqbrkr`` (see ``tests/realbroker.py``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Dict, Iterator, List, NoReturn, Optional

import pytest

from realbroker import RealBroker
from tlsutil import Stunnel, make_certificates, openssl_available, stunnel_binary

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BMQ_SHARED_DIR", ROOT.parent / "shared"))
VECTORS = SHARED / "protocol" / "vectors"
CAPTURES = SHARED / "protocol" / "captures"
BMQBRKR = SHARED / "bmqbrkr"


def _missing(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (required under CI=true)")
    pytest.skip(reason)


def _require(path: Path, what: str = "the protocol test data") -> Path:
    if path.is_dir():
        return path
    _missing(f"{path} not found: {what} lives in ../shared beside the checkout")


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    """``../shared/protocol/vectors`` (binary events made by the Java SDK)."""
    return _require(VECTORS)


@pytest.fixture(scope="session")
def captures_dir() -> Path:
    """``../shared/protocol/captures`` (whole sessions recorded against a real bmqbrkr)."""
    return _require(CAPTURES)


@pytest.fixture(scope="session")
def bmqbrkr_home() -> Path:
    """``../shared/bmqbrkr``: the real BlazingMQ broker, its ``run`` script and config template."""
    return _require(BMQBRKR, "the real BlazingMQ broker (bmqbrkr)")


@pytest.fixture(scope="session")
def bmqbrkr(bmqbrkr_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealBroker]:
    """One real ``bmqbrkr`` for the whole test run (tests use fresh queue names to stay apart)."""
    with RealBroker(bmqbrkr_home, tmp_path_factory.mktemp("bmqbrkr")) as broker:
        yield broker


@pytest.fixture
def make_bmqbrkr(bmqbrkr_home: Path, tmp_path: Path) -> Iterator[Callable[..., RealBroker]]:
    """A factory of real brokers owned by one test (own directory, config template, restarts);
    every broker it made is stopped after the test."""
    made: List[RealBroker] = []

    def make(*, etc: Optional[Path] = None, directory: Optional[Path] = None, start: bool = True) -> RealBroker:
        broker = RealBroker(bmqbrkr_home, directory or tmp_path / f"bmqbrkr{len(made)}", etc=etc)
        made.append(broker)
        return broker.start() if start else broker

    yield make
    for broker in made:
        broker.stop()


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """Certificates and keys made for this run by ``openssl`` (see ``tests/tlsutil.py``)."""
    if not openssl_available():
        _missing("the openssl command is needed to make the TLS tests' certificates")
    return make_certificates(tmp_path_factory.mktemp("certificates"))


@pytest.fixture
def make_stunnel(tmp_path: Path) -> Iterator[Callable[..., Stunnel]]:
    """A factory of TLS terminators (Debian's stunnel4) in front of an address, stopped after
    the test: ``make_stunnel(upstream, cert, key, client_ca=None)``."""
    binary = stunnel_binary()
    if binary is None:
        _missing("stunnel4 is needed for TLS in front of bmqbrkr (apt-get install stunnel4)")
    made: List[Stunnel] = []

    def make(upstream: str, cert: Path, key: Path, client_ca: Optional[Path] = None) -> Stunnel:
        terminator = Stunnel(binary, tmp_path / f"stunnel{len(made)}", upstream, cert, key, client_ca)
        made.append(terminator)
        return terminator.start()

    yield make
    for terminator in made:
        terminator.stop()
