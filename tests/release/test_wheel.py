"""The distributions: ``scripts/check_wheel.py --offline`` builds the sdist and the wheel, repairs
the wheel into a manylinux wheel, and installs and runs it in a fresh venv with no C compiler on
PATH (where the sdist must fail to install). Offline: tests reach no network, so the venv takes
crc32c and zstandard from this interpreter (see the script's docstring)."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.release, pytest.mark.timeout(600)]


def _require_release_tools() -> None:
    missing = [name for name in ("build", "twine", "auditwheel", "Cython", "wheel")
               if importlib.util.find_spec(name) is None]
    if not missing:
        return
    reason = f"{', '.join(missing)} not installed (the release extra: pip install -e '.[release]')"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (required under CI=true)")
    pytest.skip(reason)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="repairs Linux wheels (auditwheel)")
def test_wheel_installs_and_runs_without_a_compiler(tmp_path: Path) -> None:
    _require_release_tools()
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_wheel.py"), "--offline", "--out",
                             str(tmp_path), "--bench-count", "20000"], cwd=ROOT, capture_output=True, text=True,
                            timeout=570)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    assert "the sdist does not install without a compiler, as expected" in output
    assert "smoke test passed" in output and "all checks passed" in output
    repaired = list((tmp_path / "wheelhouse").glob("*.whl"))
    assert len(repaired) == 1 and re.fullmatch(r"bmq-[^-]+-cp\d+-cp\d+-manylinux_\d+_\d+_x86_64\.whl|"
                                               r"bmq-[^-]+-cp\d+-cp\d+-manylinux_\d+_\d+_aarch64\.whl",
                                               repaired[0].name), repaired
