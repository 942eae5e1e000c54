#!/usr/bin/env bash
# bmq's tests on every supported CPython besides 3.11 (the main suite's): 3.10, 3.12 and 3.13
# from pyenv, 3.14 from a Debian testing chroot (.ci/debian-chroot.sh, cached in
# $BMQ_CI_CACHE, default /var/cache/bmq-ci). Each version gets its own copy of the checkout
# (its editable build writes the codec beside the sources) and its own venv with the test extra,
# then runs the unit and embedded-broker tests, and a round trip through the real bmqbrkr (from
# ../shared). Left out there: Spark (the main suite's; pyspark is version-independent
# Python), the release tests (scripts/build_wheels.py covers every version) and mypy (typing is
# checked once, on 3.11). Two versions run at a time: the cores are shared with the main suite.
# Exit status: 0 when every version passed. Usage: .ci/pythons.sh [VERSION...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
shared=$(realpath "${BMQ_SHARED_DIR:-$root/../shared}")
versions=("${@:-3.10 3.12 3.13 3.14}")
read -r -a versions <<<"${versions[*]}"
work=$(mktemp -d -t bmq-pythons.XXXXXX)
# The unit and embedded-broker tests, and one round trip through the real bmqbrkr (the main
# suite runs every real-broker test on 3.11; the client code they add is version-independent).
pytest_args=(-q -p no:cacheprovider tests/unit tests/integration -m "not release and not slow"
             -k "not bmqbrkr or test_post_then_get_round_trips_payload_properties_and_guid"
             --ignore-glob 'tests/integration/test_spark*' --ignore tests/integration/spark_driver.py
             --deselect tests/unit/test_typing.py)

trap 'rm -rf "$work"' EXIT

interpreter() {  # the newest pyenv CPython $1 (3.12 -> $PYENV_ROOT/versions/3.12.1/bin/python3.12)
    local versions=${PYENV_ROOT:-$HOME/.pyenv}/versions found
    found=$(find "$versions" -maxdepth 1 -regex ".*/$1\.[0-9]+" -printf '%f\n' 2>/dev/null | sort -V | tail -1)
    [ -n "$found" ] && [ -x "$versions/$found/bin/python$1" ] ||
        { echo "no CPython $1 in $versions (pyenv install $1)" >&2; return 1; }
    echo "$versions/$found/bin/python$1"
}

# One version's run, in $work/$version: copy, venv, install, tests. Output goes to its log.
run_version() {
    local version=$1 python tree="$work/$version/bmq" started=$SECONDS
    mkdir -p "$tree"
    git -C "$root" ls-files -z --cached --others --exclude-standard | (cd "$root" && xargs -0 cp --parents -t "$tree")
    ln -s "$shared" "$work/$version/shared"  # ../shared beside the copy, as beside the checkout
    local script="
        set -euo pipefail
        cd '$tree'
        \$PYTHON -m venv '$work/$version/venv'
        . '$work/$version/venv/bin/activate'
        python -m pip install -q --disable-pip-version-check -e '.[test]'
        echo \"[pythons] \$(python --version): installed in \$((SECONDS)) s\"
        CI=true BMQ_SHARED_DIR='$shared' python -m pytest ${pytest_args[*]@Q}
    "
    if [ "$version" = 3.14 ]; then
        local chroot_dir status=0
        chroot_dir=$("$root/.ci/debian-chroot.sh" testing-amd64 | tee /dev/stderr | tail -1)
        for path in "$work" "$shared"; do  # the same paths inside the chroot as outside
            mkdir -p "$chroot_dir$path"
            mountpoint -q "$chroot_dir$path" || mount --bind "$path" "$chroot_dir$path"
        done
        chroot "$chroot_dir" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
            PYTHON=python3.14 bash -c "$script" || status=$?
        # Only this run's mounts: /proc and /dev/shm stay for others using the chroot (scripts/build_wheels.py).
        umount -l "$chroot_dir$work" "$chroot_dir$shared"
        [ "$status" -eq 0 ] || return "$status"
    else
        python=$(interpreter "$version")
        PYTHON=$python bash -c "$script"
    fi
    echo "[pythons] $version: done in $((SECONDS - started)) s"
}

echo "[pythons] CPython ${versions[*]}, two at a time; logs in $work"
declare -A pids=() status=()
running=()
for version in "${versions[@]}"; do
    if [ ${#running[@]} -ge 2 ]; then  # wait for the older of the two running
        wait "${pids[${running[0]}]}" && status[${running[0]}]=0 || status[${running[0]}]=$?
        running=("${running[@]:1}")
    fi
    run_version "$version" >"$work/$version.log" 2>&1 &
    pids[$version]=$!
    running+=("$version")
done
for version in "${running[@]}"; do
    wait "${pids[$version]}" && status[$version]=0 || status[$version]=$?
done

failed=0
for version in "${versions[@]}"; do
    echo "[pythons] ===== CPython $version (exit ${status[$version]}):"
    # The log's head (install) and tail (the pytest summary, failures first) are what tells.
    if [ "${status[$version]}" -eq 0 ]; then tail -5 "$work/$version.log"; else tail -150 "$work/$version.log"; failed=1; fi
done
for version in "${versions[@]}"; do
    grep -h -E "^\[pythons\] $version: done|^[0-9]+ (passed|failed)" "$work/$version.log" | tail -2 | sed "s/^/[pythons] $version: /"
done
exit $failed
