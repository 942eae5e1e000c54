#!/usr/bin/env bash
# The Spark tests on every pyspark minor bmq supports besides the one the test command installs
# (pyproject.toml's `spark` extra: pyspark>=4.1,<4.4; the newest comes with the test command).
# Each version gets a virtual environment of its own that sees the interpreter's packages
# (pytest, pyarrow, ... from the test command's install) but its own pyspark, and runs the
# subset that covers the data source's paths: batch write (with a retried task), batch read,
# streaming, AvailableNow (skipped where pyspark < 4.2, which cannot tell the source), and the
# source's logic without a JVM. bmq comes from this checkout (PYTHONPATH), with its codec built
# in place by the test command's editable install (or here when it is missing).
#
# Standalone: `bash .ci/pyspark-versions.sh [VERSION ...]` from anywhere; exits non-zero if
# any version fails. Takes ~4 minutes per version on a quiet 2-core machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(4.1.4 4.2.1)
subset='write_100k or retried_task or batch_read_drains or stream_moves or available_now'
root=${BMQ_PYSPARK_VENVS:-$(mktemp -d -t bmq-pyspark.XXXXXX)}

if ! ls bmq/_codec*.so >/dev/null 2>&1; then
    echo "[pyspark-versions] building the codec in place"
    python3 setup.py -q build_ext --inplace
fi

failed=()
for version in "${versions[@]}"; do
    venv="$root/pyspark-$version"
    [ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
    echo "[pyspark-versions] pyspark $version: installing"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "pyspark[connect]==$version"
    echo "[pyspark-versions] pyspark $version: $("$venv/bin/python" -c 'import pyspark; print(pyspark.__version__, pyspark.__file__)')"
    start=$SECONDS
    if PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
            tests/integration/test_spark_units.py tests/integration/test_spark.py -k "$subset"; then
        echo "[pyspark-versions] pyspark $version: passed in $((SECONDS - start)) s"
    else
        echo "[pyspark-versions] pyspark $version: FAILED after $((SECONDS - start)) s"
        failed+=("$version")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "[pyspark-versions] failed on pyspark ${failed[*]}" >&2
    exit 1
fi
