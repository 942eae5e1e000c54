"""A pytest plugin that runs a test suite written for ``blazingmq`` on :mod:`bmq.compat`:
``python -m pytest -p bmq.compat.pytest_plugin ...``.

Loaded before the test modules are collected, it calls :func:`bmq.compat.install`. Test
processes started by the tests (``subprocess`` with ``sys.executable``) get it too: a directory
holding a ``blazingmq`` package that installs bmq.compat is put first on ``PYTHONPATH``.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from . import install

__all__ = ["SHIM"]

install()

_SHIM_CODE = '"""blazingmq, redirected to bmq.compat (bmq.compat.pytest_plugin)."""\n' \
             "import sys\n\ndel sys.modules[__name__]  # install() puts bmq.compat in its place\n" \
             "import bmq.compat  # noqa: E402\n\nbmq.compat.install()\n"

SHIM = Path(tempfile.mkdtemp(prefix="bmq-compat-shim-"))
"""The directory put first on ``PYTHONPATH`` for child processes (removed at exit)."""
(SHIM / "blazingmq").mkdir()
(SHIM / "blazingmq" / "__init__.py").write_text(_SHIM_CODE)
_path = os.environ.get("PYTHONPATH")
os.environ["PYTHONPATH"] = f"{SHIM}{os.pathsep}{_path}" if _path else str(SHIM)
atexit.register(shutil.rmtree, SHIM, True)
