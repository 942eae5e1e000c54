"""Fixtures of the cluster tests: one real 3-node BlazingMQ cluster with two proxies for the
whole test run (``tests/realcluster.py``), and a guard that hands each test a healthy cluster.

Like the other real-broker fixtures, the cluster skips when ``../shared/bmqbrkr`` (or its
``run-cluster``) is absent, and fails instead under ``CI=true``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from realcluster import RealCluster


@pytest.fixture(scope="session")
def cluster(bmqbrkr_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """Three nodes and two proxies (``proxy``, ``proxy2``) on a free 127.0.0.1 port range,
    started once per test run and stopped at its end. Tests use fresh queue names."""
    if not (bmqbrkr_home / "run-cluster").is_file():
        reason = f"{bmqbrkr_home / 'run-cluster'} not found: the cluster runner lives in ../shared/bmqbrkr"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} (required under CI=true)")
        pytest.skip(reason)
    with RealCluster(bmqbrkr_home, tmp_path_factory.mktemp("cluster") / "c", nodes=3, proxies=2) as started:
        yield started


@pytest.fixture(autouse=True)
def healthy_cluster(cluster: RealCluster) -> RealCluster:
    """Before each test: restart whatever a previous test left dead and wait until the cluster
    is whole (all brokers alive, all nodes AVAILABLE, one leader primary of every partition),
    so that a failing test cannot poison the next ones."""
    cluster.ensure_healthy()
    return cluster
