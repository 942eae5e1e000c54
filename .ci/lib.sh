# Sourced by .ci/run: CI pieces that run in the background beside the main suite.
#   ci_background NAME COMMAND [ARG...]   start COMMAND (e.g. .ci/pythons.sh) now, under nice, in
#                                         its own process group, its output to a log
#   ci_wait_all                           wait for every piece, print each log and a summary;
#                                         returns 1 when any piece failed
# A piece is a script that exits non-zero on failure and prints what it ran; it must not use
# apt/dpkg without waiting for their lock (apt-get -o DPkg::Lock::Timeout=600), since the pieces
# and .ci/run install packages at the same time. The pieces share the machine's cores with the
# main suite, which keeps its priority (the pieces run at nice 10). A piece starts with SIGINT
# and SIGQUIT at their default, as from a terminal (see CI_SIGNALS_AT_DEFAULT).

CI_LOGS=$(mktemp -d -t bmq-ci-logs.XXXXXX)
CI_NAMES=()
declare -A CI_PIDS=() CI_STARTED=()

# Bash starts a background job of a non-interactive shell with SIGINT and SIGQUIT ignored, and
# cannot give a signal ignored at its own start back its default; a piece's programs would
# inherit that (a test interrupting its child would see it carry on). This launcher sets them
# to their default, and SIGPIPE and SIGXFSZ too (Python ignores those for itself), then execs.
CI_SIGNALS_AT_DEFAULT=(python3 -c 'import os, signal, sys
for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(number, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])')

ci_background() {
    local name=$1
    shift
    CI_NAMES+=("$name")
    CI_STARTED[$name]=$SECONDS
    setsid nice -n 10 "${CI_SIGNALS_AT_DEFAULT[@]}" "$@" </dev/null >"$CI_LOGS/$name.log" 2>&1 &
    CI_PIDS[$name]=$!
    echo "[ci] $name: started in the background (pid ${CI_PIDS[$name]}): $*"
}

ci_stop_all() {  # on an early exit: end the pieces still running (their whole process groups)
    local name
    for name in "${CI_NAMES[@]}"; do
        kill -0 "${CI_PIDS[$name]}" 2>/dev/null && kill -- "-${CI_PIDS[$name]}" 2>/dev/null
    done
    return 0
}
trap ci_stop_all EXIT

ci_wait_all() {
    local name status failed=0 summary=()
    for name in "${CI_NAMES[@]}"; do
        if wait "${CI_PIDS[$name]}"; then status=passed; else status="FAILED (exit $?)"; failed=1; fi
        summary+=("[ci] $name: $status, $((SECONDS - CI_STARTED[$name])) s")
        echo "[ci] ===== $name: $status; its log ($CI_LOGS/$name.log):"
        cat "$CI_LOGS/$name.log"
    done
    CI_NAMES=()
    printf '%s\n' "${summary[@]}"
    return $failed
}
