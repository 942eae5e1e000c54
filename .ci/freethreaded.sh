#!/usr/bin/env bash
# The free-threaded job (issue 41): builds CPython 3.13t (cached in the run's work directory),
# installs bmq and its test dependencies there, and runs the unit tests and the embedded-broker
# integration tests with the GIL off (PYTHON_GIL=0: an extension that had not declared itself
# free-threading compatible would otherwise turn it back on). Standalone: .ci/run may start it
# in the background beside the main suite.
#
#   .ci/freethreaded.sh [WORK_DIR]     # default: .ci-work in the clone (BMQ_CI_WORK overrides)
#
# Not run here (the main suite runs them on the GIL build): the typing test (mypy 2.x has no
# cp313t wheel and needs a Rust toolchain), Spark (no pyspark/pyarrow for 3.13t), the interop
# tests (the official SDK has no cp313t wheel) and the real-bmqbrkr variants (the broker
# under test is bmq's, the client side is what runs free-threaded).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

work=$(realpath -m "${1:-${BMQ_CI_WORK:-.ci-work}}")
mkdir -p "$work"
started=$(date +%s)
.ci/build-cpython-ft.sh "$work/cpython-3.13t"
built=$(date +%s)

venv="$work/venv-3.13t"
[ -x "$venv/bin/python" ] || "$work/cpython-3.13t/bin/python3.13t" -m venv "$venv"
# --prefer-binary: newer hypothesis releases pull a dependency that builds with Rust on cp313t.
# pyarrow (the codec's Arrow column tests) has cp313t wheels since 18.
"$venv/bin/python" -m pip install -q --disable-pip-version-check --prefer-binary \
    "Cython>=3.1" "setuptools>=64" wheel "pytest>=7.4" "pytest-timeout>=2.2" "hypothesis>=6.90" \
    "opentelemetry-sdk>=1.20" "crc32c>=2.3" "zstandard>=0.21" "pyarrow>=14"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
# Importing the codec must leave the GIL off (it declares freethreading_compatible).
"$venv/bin/python" -W error::RuntimeWarning -c \
    'import sys, bmq; assert not sys._is_gil_enabled(), "importing bmq enabled the GIL"'

echo "[ft] unit and embedded-broker tests on $("$venv/bin/python" -VV | head -1), PYTHON_GIL=0"
# CI unset: what 3.13t cannot install skips (the main suite requires it under CI=true).
env -u CI PYTHON_GIL=0 nice -n 5 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/unit tests/integration -m "not slow" \
    --ignore=tests/unit/test_typing.py \
    --ignore-glob='tests/integration/test_spark*' \
    -k "not bmqbrkr"
echo "[ft] done: build $((built - started)) s, tests $(( $(date +%s) - built )) s"
