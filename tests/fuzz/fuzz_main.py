"""One fuzz target under atheris (libFuzzer), run by ``scripts/fuzz.py`` in its own process:

    python tests/fuzz/fuzz_main.py TARGET CODEC_SO [libFuzzer options] [CORPUS_DIR ...]

``CODEC_SO`` is the codec extension built with the sanitizers (``scripts/fuzz.py`` builds
it); it is loaded as ``bmq._codec`` in place of the installed one, so that every other
module of bmq is the checkout's. The process must start with the sanitizer runtime
preloaded (``LD_PRELOAD=<atheris>/asan_with_fuzzer.so``), as atheris documents for native
extensions. bmq's Python modules are instrumented for coverage too.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

import atheris


class _SanitizedCodec(importlib.abc.MetaPathFinder):
    """Finds ``bmq._codec`` at the sanitized build's path, before any other finder."""

    def __init__(self, path: str) -> None:
        self.path = path

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: object = None
                  ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != "bmq._codec":
            return None
        return importlib.util.spec_from_file_location(fullname, self.path)


def main() -> None:
    name, codec_path = sys.argv[1], sys.argv[2]
    # Warnings about dropped bad input are the expected outcome: millions of them would only
    # slow the fuzzer down and bury its own output. (Here, not in targets.py: the test suite
    # imports that module, and the whole pytest process would lose its logging.)
    logging.disable(logging.CRITICAL)
    sys.meta_path.insert(0, _SanitizedCodec(codec_path))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    with atheris.instrument_imports(include=["bmq"]):
        import bmq._codec
        import targets
    if bmq._codec.__file__ != codec_path:  # noqa: SLF001
        raise SystemExit(f"bmq._codec came from {bmq._codec.__file__}, not the sanitized {codec_path}")  # noqa: SLF001
    run = targets.TARGETS[name].run
    # libFuzzer runs argv[0] through the shell for -merge's inner process: make it a whole
    # command that comes back here for the same target.
    again = " ".join(map(shlex.quote, (sys.executable, sys.argv[0], name, codec_path)))
    atheris.Setup([again] + sys.argv[3:], run)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
