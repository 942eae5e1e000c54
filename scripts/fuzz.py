"""Coverage-guided fuzzing of every bmq entry point that takes outside bytes.

    python scripts/fuzz.py [--target NAME|all] [--seconds N] [--json FILE] [--jobs J] [--runs N]
    python scripts/fuzz.py --seed        # rebuild the kept corpus (seeds from ../shared/protocol + finds)
    python scripts/fuzz.py --list

Builds what it needs: the codec extension with AddressSanitizer and UndefinedBehaviorSanitizer
(and libFuzzer's coverage instrumentation) under ``build/fuzz/``, apart from the normal
install, with Debian's clang (``clang-14``, or ``$CC``). Then runs each target of
``tests/fuzz/targets.py`` under atheris (libFuzzer for Python; ``pip install ".[fuzz]"``) for
``--seconds``, starting from its kept corpus ``tests/fuzz/corpus/<target>/`` (new inputs go to
``build/fuzz/corpus/<target>/``, not the repository), with the sanitizer runtime preloaded.

Prints per target: executions, coverage (libFuzzer's ``cov``: instrumented edges, C and
Python), crashes (an exception the entry point does not document, a failed check, a
sanitizer report), hangs (an input over 1 s) and leaks (memory that keeps growing while the
target's inputs are replayed over and over, in a plain interpreter: Python's own allocations
make LeakSanitizer useless here). A crashing input is kept in
``build/fuzz/artifacts/<target>/``: copy it into ``tests/fuzz/crashes/<target>/`` with the
fix, and ``tests/fuzz/test_corpus.py`` replays it in every test run.

Exits 1 on any crash, hang or leak; 2 when something needed is missing.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
FUZZ_DIR = ROOT / "tests" / "fuzz"
BUILD = ROOT / "build" / "fuzz"
SHARED = Path(os.environ.get("BMQ_SHARED_DIR", ROOT.parent / "shared"))
#: An input taking longer than this is a hang.
HANG_SECONDS = 1
#: ASan's quarantine (freed memory held back to catch use-after-free) would otherwise grow
#: each fuzzing process to ~1 GB on these small inputs; 64 MB keeps two in the machine.
ASAN_OPTIONS = ("detect_leaks=0:allocator_may_return_null=1:quarantine_size_mb=64:"
                "malloc_context_size=20:detect_stack_use_after_return=0:abort_on_error=0")
UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1"

sys.path.insert(0, str(FUZZ_DIR))


class Missing(RuntimeError):
    """A tool this script needs is not installed (the message says how to get it)."""


def _clang() -> str:
    for name in filter(None, (os.environ.get("CC"), "clang-14", "clang")):
        path = shutil.which(name)
        if path and "clang" in Path(path).name:
            return path
    raise Missing("clang not found: apt-get install clang-14 libclang-rt-14-dev (or set CC to a clang)")


def _atheris_runtime() -> Path:
    try:
        import atheris
    except ImportError:
        raise Missing('atheris is not installed: pip install ".[fuzz]"') from None
    runtime = Path(atheris.path()) / "asan_with_fuzzer.so"
    if not runtime.exists():
        raise Missing(f"{runtime} missing: this atheris was built without its sanitizer runtime")
    return runtime


def build_codec(log=print) -> Path:
    """The sanitized codec extension, rebuilt when a source is newer; returns its path."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = BUILD / "lib" / "bmq" / f"_codec{suffix}"
    sources = [ROOT / "bmq" / "_codec.pyx", ROOT / "setup.py", *sorted((ROOT / "bmq" / "_wire").iterdir())]
    if target.exists() and target.stat().st_mtime >= max(p.stat().st_mtime for p in sources):
        return target
    clang = _clang()
    flags = "-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=all -fno-omit-frame-pointer -g"
    env = dict(os.environ, CC=clang, LDSHARED=f"{clang} -shared", CFLAGS=flags,
               LDFLAGS="-fsanitize=address,undefined")
    log(f"[fuzz] building the codec with ASan+UBSan ({clang}) in {BUILD}")
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / "build.log", "w", encoding="utf-8") as out:
        done = subprocess.run([sys.executable, "setup.py", "build_ext", "--force", "--build-temp",
                               str(BUILD / "tmp"), "--build-lib", str(BUILD / "lib")],
                              cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode or not target.exists():
        raise RuntimeError(f"the sanitized build failed: see {BUILD / 'build.log'}")
    return target


_STATUS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+)", re.M)
_EXECS = re.compile(r"stat::number_of_executed_units: (\d+)")
_ARTIFACT = re.compile(r"Test unit written to (\S+)")


def _env(runtime: Path) -> Dict[str, str]:
    return dict(os.environ, LD_PRELOAD=str(runtime), ASAN_OPTIONS=ASAN_OPTIONS, UBSAN_OPTIONS=UBSAN_OPTIONS,
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def fuzz_target(name: str, seconds: float, codec_path: Path, runtime: Path, runs: int = 0,
                max_len: int = 4096) -> Dict[str, Any]:
    """Fuzz ``name`` for ``seconds`` (or ``runs`` executions, when fewer and not 0); its
    figures (and the artifact of a crash or hang)."""
    work = BUILD / "corpus" / name
    artifacts = BUILD / "artifacts" / name
    work.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    kept = FUZZ_DIR / "corpus" / name
    command = [sys.executable, str(FUZZ_DIR / "fuzz_main.py"), name, str(codec_path),
               f"-max_total_time={max(1, int(seconds))}", f"-timeout={HANG_SECONDS}", f"-max_len={max_len}",
               "-print_final_stats=1", "-rss_limit_mb=2048", f"-artifact_prefix={artifacts}/", str(work)]
    if runs:
        command.insert(-1, f"-runs={runs}")
    if kept.is_dir():
        command.append(str(kept))
    log_path = BUILD / "logs" / f"{name}.{os.getpid()}.log"  # per run: two runs at once keep their own
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "w", encoding="utf-8", errors="replace") as out:
        # The grace beyond --seconds: loading the corpus, and a slow input's one second.
        try:
            rc = subprocess.run(command, env=_env(runtime), stdout=out, stderr=subprocess.STDOUT,
                                timeout=seconds + 120).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    text = log_path.read_text(encoding="utf-8", errors="replace")
    statuses = _STATUS.findall(text)
    execs = (_EXECS.findall(text) or [None])[-1]
    hang = "ERROR: libFuzzer: timeout" in text or rc == -1
    artifact = _ARTIFACT.search(text)
    return {
        "execs": int(execs) if execs else (int(statuses[-1][0]) if statuses else 0),
        "cov": int(statuses[-1][1]) if statuses else 0,
        "ft": int(statuses[-1][2]) if statuses else 0,
        "crashes": int(rc != 0 and not hang),
        "hangs": int(hang),
        "seconds": round(time.monotonic() - started, 1),
        "corpus": len(list(work.iterdir())),
        "artifact": artifact.group(1) if artifact else None,
        "log": str(log_path),
    }


def leak_check(name: str, rounds: int = 12) -> Dict[str, Any]:
    """Replay the target's inputs (kept corpus and this run's) ``rounds`` times in a plain
    interpreter and look at Python's allocated blocks and glibc's bytes in use after each.
    A leak grows in both of the last two thirds of the rounds; caches and free lists fill
    early, and a pool that grows once (a step) does not grow in both."""
    probe = (
        "import sys, gc, ctypes, logging; logging.disable(logging.CRITICAL)\n"
        "sys.path.insert(0, sys.argv[1]); import targets\n"
        "from pathlib import Path\n"
        "paths = [p for d in sys.argv[3:] if Path(d).is_dir() for p in sorted(Path(d).iterdir())][:2000]\n"
        "data = [p.read_bytes() for p in paths]; run = targets.TARGETS[sys.argv[2]].run\n"
        "libc = ctypes.CDLL(None)\n"
        "class M(ctypes.Structure): _fields_ = [(n, ctypes.c_size_t) for n in 'arena ordblks smblks hblks hblkhd "
        "usmblks fsmblks uordblks fordblks keepcost'.split()]\n"
        "libc.mallinfo2.restype = M\n"
        "def used():\n gc.collect(); m = libc.mallinfo2(); return sys.getallocatedblocks(), m.uordblks + m.hblkhd\n"
        f"marks = []\nfor _ in range({rounds}):\n"
        "    for d in data:\n        try: run(d)\n        except Exception: pass\n    marks.append(used())\n"
        "print(len(data), *(v for i in (len(marks) // 3, 2 * len(marks) // 3, -1) for v in marks[i]))\n"
    )
    dirs = [str(FUZZ_DIR / "corpus" / name), str(BUILD / "corpus" / name)]
    done = subprocess.run([sys.executable, "-c", probe, str(FUZZ_DIR), name, *dirs], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if done.returncode:
        return {"leaks": 0, "leak_check": f"replay failed: {done.stderr.strip().splitlines()[-1:]}"}
    inputs, b1, m1, b2, m2, b3, m3 = map(int, done.stdout.split())
    third = rounds - 2 * (rounds // 3)  # rounds per third, about
    block_limit, byte_limit = max(50, inputs / 10) * third, max(64 * 1024, inputs * 64) * third
    leaking = (b2 - b1 > block_limit and b3 - b2 > block_limit) or (m2 - m1 > byte_limit and m3 - m2 > byte_limit)
    return {"leaks": int(leaking), "leak_check": f"{inputs} inputs x {rounds}: {b2 - b1:+} then {b3 - b2:+} blocks, "
                                                 f"{(m2 - m1) / 1024:+.1f} then {(m3 - m2) / 1024:+.1f} KB "
                                                 f"(each over {third} replays)"}


def seed(codec_path: Path, runtime: Path, names: List[str]) -> None:
    """Rebuild ``tests/fuzz/corpus/<name>/`` from the seeds, the kept corpus and what fuzzing
    found so far, minimized by libFuzzer's merge."""
    import seeds as seed_module

    if not SHARED.is_dir():
        raise Missing(f"{SHARED} not found: the seeds come from ../shared/protocol")
    every = seed_module.seeds(SHARED)
    for name in names:
        kept = FUZZ_DIR / "corpus" / name
        with tempfile.TemporaryDirectory(prefix=f"bmq-seed-{name}-") as tmp:
            for i, data in enumerate(every.get(name, [])):
                (Path(tmp) / f"seed-{i:03d}").write_bytes(data)
            # What earlier fuzzing found (build/fuzz/corpus) joins the merge too: the kept
            # corpus takes the inputs that add coverage.
            previous = [d for d in (kept, BUILD / "corpus" / name) if d.is_dir()]
            merged = Path(tmp) / "merged"
            merged.mkdir()
            command = [sys.executable, str(FUZZ_DIR / "fuzz_main.py"), name, str(codec_path), "-merge=1",
                       f"-timeout={HANG_SECONDS}", str(merged), tmp, *map(str, previous)]
            done = subprocess.run(command, env=_env(runtime), capture_output=True, text=True, errors="replace")
            if done.returncode:
                raise RuntimeError(f"merging the {name} corpus failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
            if kept.is_dir():
                shutil.rmtree(kept)
            kept.mkdir(parents=True)
            for path in merged.iterdir():
                shutil.copy(path, kept / path.name)
        print(f"[fuzz] {name}: {len(list(kept.iterdir()))} inputs kept "
              f"({sum(p.stat().st_size for p in kept.iterdir())} bytes)")


def main(argv: Optional[List[str]] = None) -> int:
    from targets import OPEN_FINDINGS, TARGETS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="all", help="a target name, several joined by commas, or all (default)")
    parser.add_argument("--seconds", type=float, default=60.0, help="per target (default: %(default)s)")
    parser.add_argument("--json", metavar="FILE", help='write {"targets": {name: {"execs", "crashes", "hangs", ...}}}')
    parser.add_argument("--runs", type=int, default=0,
                        help="stop a target after this many executions if before --seconds (default: no limit)")
    parser.add_argument("--jobs", type=int, default=1, help="targets fuzzed at once (default: %(default)s)")
    parser.add_argument("--no-leak-check", action="store_true", help="skip the replay that looks for leaks")
    parser.add_argument("--seed", action="store_true", help="rebuild the kept corpus from ../shared/protocol")
    parser.add_argument("--list", action="store_true", help="list the targets")
    args = parser.parse_args(argv)
    if args.list:
        for name, target in TARGETS.items():
            print(f"{name:16} {target.what}")
        return 0
    # "all" leaves out a target with an open finding (it would stop at that crash at once);
    # named explicitly, it runs.
    held = {finding.split("/")[0]: why for finding, why in OPEN_FINDINGS.items()}
    names = [n for n in TARGETS if n not in held] if args.target == "all" else args.target.split(",")
    if args.target == "all":
        for name, why in held.items():
            print(f"[fuzz] {name}: left out, open finding: {why}")
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target {unknown[0]!r}: one of {', '.join(TARGETS)} or all")
    try:
        runtime = _atheris_runtime()
        codec_path = build_codec()
    except Missing as exc:
        print(f"[fuzz] {exc}", file=sys.stderr)
        return 2
    if args.seed:
        seed(codec_path, runtime, names)
        return 0

    def one(name: str) -> Dict[str, Any]:
        result = fuzz_target(name, args.seconds, codec_path, runtime, args.runs)
        if not args.no_leak_check:
            result.update(leak_check(name))
        return result

    print(f"[fuzz] {len(names)} target(s), {args.seconds:g} s each, {args.jobs} at a time")
    print(f"{'target':16} {'execs':>11} {'exec/s':>7} {'cov':>6} {'ft':>6} {'crashes':>7} {'hangs':>5} {'leaks':>5}")
    results: Dict[str, Dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for name, result in zip(names, pool.map(one, names)):
            results[name] = result
            rate = result["execs"] / max(result["seconds"], 1e-9)
            print(f"{name:16} {result['execs']:>11,} {rate:>7,.0f} {result['cov']:>6} {result['ft']:>6} "
                  f"{result['crashes']:>7} {result['hangs']:>5} {result.get('leaks', 0):>5}", flush=True)
            if result["crashes"] or result["hangs"]:
                print(f"    -> {result['artifact'] or 'no artifact'}; log {result['log']}", flush=True)
            if result.get("leaks"):
                print(f"    -> leak: {result['leak_check']}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"targets": results, "seconds_per_target": args.seconds}, f, indent=1)
            f.write("\n")
    bad = sum(r["crashes"] + r["hangs"] + r.get("leaks", 0) for r in results.values())
    print(f"[fuzz] {'FAIL' if bad else 'PASS'}: {sum(r['execs'] for r in results.values()):,} executions, "
          f"{bad} finding(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
