"""Shared test fixtures.

``../shared`` (protocol vectors and captures) sits beside the project checkout in the
development and CI set-up. In a user's clone it is absent: tests that need it skip with
the reason; under CI (``CI=true``) its absence fails them instead.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BMQ_SHARED_DIR", ROOT.parent / "shared"))
VECTORS = SHARED / "protocol" / "vectors"
CAPTURES = SHARED / "protocol" / "captures"


def _require(path: Path) -> Path:
    if path.is_dir():
        return path
    reason = f"{path} not found: the protocol test data lives in ../shared beside the checkout"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (required under CI=true)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    """``../shared/protocol/vectors`` (binary events made by the Java SDK)."""
    return _require(VECTORS)


@pytest.fixture(scope="session")
def captures_dir() -> Path:
    """``../shared/protocol/captures`` (whole sessions recorded against a real bmqbrkr)."""
    return _require(CAPTURES)
