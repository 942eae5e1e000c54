"""``scripts/build_wheels.py``'s pieces that decide what a wheel says it is, without compiling
anything (the full run, one codec compile per version and architecture, is for a release, not
CI): the tags of each target (the free-threaded build's ``cp313-cp313t``), the wheel it packs
around a codec, the ABI check that lets x86_64 headers serve aarch64, and the summary it reads
from the checks' output."""
from __future__ import annotations

import importlib.util
import os
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.release


@pytest.fixture(scope="module")
def build_wheels() -> ModuleType:
    saved = list(sys.path)  # the script puts scripts/ first (for check_wheel): not for the other tests
    try:
        spec = importlib.util.spec_from_file_location("build_wheels", ROOT / "scripts" / "build_wheels.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["build_wheels"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


def test_the_free_threaded_target_has_its_own_abi_tag_and_codec_suffix(build_wheels: ModuleType) -> None:
    gil, free = build_wheels.Target("3.13", "x86_64"), build_wheels.Target("3.13t", "aarch64")
    assert (gil.wheel_tags, gil.tag, gil.freethreaded) == ("cp313-cp313", "cp313", False)
    # pip on 3.13t installs cp313-cp313t wheels, and its extension suffix is .cpython-313t-...
    assert (free.wheel_tags, free.tag, free.freethreaded) == ("cp313-cp313t", "cp313t", True)
    assert "3.13t" in build_wheels.VERSIONS


def test_the_free_threaded_prefix_serves_only_the_t_version(build_wheels: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3.13t").touch()
    assert build_wheels.local_prefix("3.13t", tmp_path) == tmp_path
    assert build_wheels.local_prefix("3.13t", tmp_path / "absent") is None
    assert build_wheels.local_prefix("3.13", tmp_path) != tmp_path


def _base_wheel(directory: Path) -> Path:
    """A wheel as the local build makes it: a cp311 codec and a RECORD."""
    wheel = directory / "bmq-0.1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("bmq/__init__.py", "")
        archive.writestr("bmq/_codec.cpython-311-x86_64-linux-gnu.so", b"old codec")
        archive.writestr("bmq-0.1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: bmq\nVersion: 0.1.0\n")
        archive.writestr("bmq-0.1.0.dist-info/WHEEL",
                         "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n")
        archive.writestr("bmq-0.1.0.dist-info/RECORD", "")
    return wheel


@pytest.mark.skipif(importlib.util.find_spec("wheel") is None, reason="wheel not installed (the release extra)")
def test_the_packed_wheel_holds_only_the_targets_codec_under_its_tags(build_wheels: ModuleType,
                                                                      tmp_path: Path) -> None:
    target = build_wheels.Target("3.13t", "aarch64")
    library = tmp_path / "_codec.cpython-313t-aarch64-linux-gnu.so"
    library.write_bytes(b"new codec")
    (tmp_path / "work").mkdir()
    wheel = build_wheels.make_wheel(target, _base_wheel(tmp_path), library, tmp_path / "work")
    assert wheel.name == "bmq-0.1.0-cp313-cp313t-linux_aarch64.whl"
    with zipfile.ZipFile(wheel) as archive:
        codecs = [name for name in archive.namelist() if name.startswith("bmq/_codec")]
        assert codecs == ["bmq/_codec.cpython-313t-aarch64-linux-gnu.so"]
        assert archive.read(codecs[0]) == b"new codec"
        assert "Tag: cp313-cp313t-linux_aarch64" in archive.read("bmq-0.1.0.dist-info/WHEEL").decode()
        assert codecs[0] in archive.read("bmq-0.1.0.dist-info/RECORD").decode()


def _pyconfig(path: Path, sizeof_long: int, extra: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#define SIZEOF_LONG {sizeof_long}\n#define ALIGNOF_LONG 8\n#define Py_GIL_DISABLED 1\n{extra}")
    return path


def test_x86_64_headers_serve_aarch64_only_when_sizes_and_alignments_match(build_wheels: ModuleType,
                                                                             tmp_path: Path) -> None:
    chroot = tmp_path / "arm64"
    include = chroot / "usr" / "include" / "aarch64-linux-gnu"
    # A newer version's name (3.11's ALIGNOF_MAX_ALIGN_T for 3.10's headers) is not a difference.
    _pyconfig(include / "python3.13" / "pyconfig.h", 8, "#define ALIGNOF_MAX_ALIGN_T 16\n")
    _pyconfig(include / "python3.14" / "pyconfig.h", 4)  # not 3.13's reference: the same version's is
    # A second chroot of the architecture (bookworm's 3.11): its version's pyconfig.h is found too.
    _pyconfig(tmp_path / "bookworm" / "usr" / "include" / "aarch64-linux-gnu" / "python3.11" / "pyconfig.h", 6)
    headers = build_wheels.Headers(tmp_path, {"aarch64": [chroot, tmp_path / "bookworm"]}, tmp_path)
    target = build_wheels.Target("3.13t", "aarch64")
    headers._check_abi(_pyconfig(tmp_path / "fits" / "pyconfig.h", 8), target)
    with pytest.raises(build_wheels.CheckFailed, match="SIZEOF_LONG"):
        headers._check_abi(_pyconfig(tmp_path / "differs" / "pyconfig.h", 4), target)
    headers._check_abi(_pyconfig(tmp_path / "fits311" / "pyconfig.h", 6), build_wheels.Target("3.11", "aarch64"))
    with pytest.raises(build_wheels.CheckFailed, match="SIZEOF_LONG"):
        headers._check_abi(tmp_path / "fits" / "pyconfig.h", build_wheels.Target("3.11", "aarch64"))
    with pytest.raises(build_wheels.CheckFailed, match="no aarch64 pyconfig.h"):
        build_wheels.Headers(tmp_path, {}, tmp_path)._check_abi(tmp_path / "fits" / "pyconfig.h", target)


def test_the_summary_says_the_smoke_tests_and_the_bench_throughput(build_wheels: ModuleType) -> None:
    output = os.linesep.join([
        "[check_wheel]   smoke test passed: bmq 0.1.0 from /v/bmq (GIL build)",
        "[check_wheel]   | client         acked  received   post msg/s    e2e msg/s     MB/s",
        "[check_wheel]   | bmq           20,000    20,000       31,234       29,876      3.0       120",
        "[check_wheel]   smoke test passed: bmq 0.1.0 from /s/bmq (GIL build)",
    ])
    line = build_wheels.summary(build_wheels.Target("3.12", "x86_64"), output)
    assert line == "checked: 2 smoke test(s) passed; bench: post 31,234 msg/s, end to end 29,876 msg/s"
    arm = build_wheels.summary(build_wheels.Target("3.14", "aarch64"), output.splitlines()[0])
    assert arm == "checked: 1 smoke test(s) passed (under qemu)"
