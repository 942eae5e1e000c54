"""What a newcomer hits first: importing an unbuilt source tree, and the child broker that
``bmq bench`` starts from the clone's root."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bmq
from bmq.broker import broker_address
from bmq.exceptions import Error

PACKAGE = Path(bmq.__file__).resolve().parent


def _source_copy(into: Path) -> Path:
    """The package's sources (no compiled codec) under ``into/bmq``."""
    shutil.copytree(PACKAGE, into / "bmq", ignore=shutil.ignore_patterns("*.so", "*.pyd", "*.c", "__pycache__"))
    return into


def test_importing_an_unbuilt_source_tree_says_what_to_do(tmp_path):
    tree = _source_copy(tmp_path)
    # -S: no site-packages, so nothing but the unbuilt tree can provide bmq._codec.
    result = subprocess.run([sys.executable, "-S", "-c", "import bmq"], cwd=tree, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: bmq's compiled wire codec (bmq._codec) is missing")
    assert str(tree / "bmq") in last and "pip install ." in last


def test_child_broker_ignores_a_bmq_source_tree_in_the_working_directory(tmp_path, monkeypatch):
    shadow = tmp_path / "bmq"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise SystemExit('the shadowing source tree was imported')\n")
    monkeypatch.chdir(tmp_path)
    with broker_address(separate_process=True, start_timeout=60) as address:
        with bmq.Session(address) as session:
            queue = session.open_queue("bmq://bmq.test.mem.priority/newcomer", write=True)
            assert queue.post(b"x").status is bmq.AckStatus.SUCCESS


def test_child_broker_that_dies_is_reported_with_its_stderr(tmp_path, monkeypatch):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: no codec here' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    # A generous start timeout: the error must come from the exit, not from waiting it out.
    with pytest.raises(Error, match=r"exited with code 3 before listening(.|\n)*no codec here"):
        with broker_address(separate_process=True, start_timeout=600):
            pass
