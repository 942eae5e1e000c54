"""Fixtures of the integration tests: an embedded broker per module, a session per test, and
one local SparkSession per test run.

A test that takes ``session`` or ``broker_address`` and not ``broker`` only needs a broker's
address: it runs twice, against the embedded broker (``[embedded]``) and against the real
bmqbrkr (``[bmqbrkr]``), and must observe the same. Tests that use the embedded broker's own API (faults, inspection) take
``broker`` and run against it alone.

Spark's Python workers must import this checkout's ``bmq`` (with its built extension): the
interpreter and ``PYTHONPATH`` are set before the JVM starts (``spark_support.py``, shared
with the driver program of the tests that run Spark in processes of their own). Without
pyspark or Java the Spark tests skip, except under ``CI=true`` where they fail: CI must run
them.
"""
from __future__ import annotations

import inspect
import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

import bmq
from bmq.broker import Broker
from spark_support import prepare_environment, spark_session


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    """An embedded broker shared by the tests of one module (modules may define their own)."""
    with Broker() as b:
        yield b


BROKER_KINDS = ("embedded", "bmqbrkr")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    arguments = inspect.signature(metafunc.function).parameters
    if ("session" in arguments or "broker_address" in arguments) and "broker" not in arguments:
        metafunc.parametrize("broker_kind", BROKER_KINDS, indirect=True)


@pytest.fixture
def broker_kind(request: pytest.FixtureRequest) -> str:
    """Which broker ``session`` connects to: "embedded" unless the test is parametrized."""
    return getattr(request, "param", "embedded")


@pytest.fixture
def broker_address(broker_kind: str, request: pytest.FixtureRequest) -> str:
    """The address of the module's embedded broker or of the run's bmqbrkr."""
    return request.getfixturevalue("bmqbrkr" if broker_kind == "bmqbrkr" else "broker").address


@pytest.fixture
def session(broker_address: str) -> Iterator[bmq.Session]:
    """A fresh session on ``broker_address``, stopped after the test."""
    with bmq.Session(broker_address) as s:
        yield s


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (required under CI=true)")
    pytest.skip(reason)


def _java_available() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return True
    return shutil.which("java") is not None


@pytest.fixture(scope="session")
def spark() -> Iterator["object"]:
    """A ``local[2,2]`` SparkSession (2 threads; a failed task is retried once) with bmq registered."""
    if not _java_available():
        _missing("a Java 17+ runtime is needed for Spark (JAVA_HOME or java on PATH)")
    prepare_environment()
    session = spark_session("local[2,2]", "bmq-tests",
                            {"spark.driver.memory": "1g", "spark.python.worker.reuse": "true"})
    try:
        yield session
    finally:
        session.stop()
