"""Typing is part of the API: mypy finds no error in bmq/ and examples/ (config in
pyproject.toml), nor in typical user code written against the public API, nor in the release
script, the documentation's configuration and the benchmark scripts."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mypy(*paths: str, tmp_path: Path) -> subprocess.CompletedProcess:
    try:
        import mypy  # noqa: F401
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("mypy is not installed (it is in the test extra; required under CI=true)")
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), *paths],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_package_and_examples_type_check(tmp_path):
    result = _mypy("bmq", "examples", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_typical_user_code_type_checks(tmp_path):
    result = _mypy("tests/typing/user_code.py", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_release_script_and_docs_configuration_type_check(tmp_path):
    result = _mypy("scripts", "docs/conf.py", "tests/release", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_benchmark_scripts_type_check(tmp_path):
    # Type-checked, never run here (speed is measured by hand, not asserted in tests).
    result = _mypy("benchmarks", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
