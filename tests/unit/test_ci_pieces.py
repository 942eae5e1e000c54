"""CI's background pieces (``.ci/lib.sh``): every piece's log is shown, and one failing piece
fails the whole run, however the others and the main suite did."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pieces(*lines: str) -> subprocess.CompletedProcess:
    script = "\n".join(["set -euo pipefail", ". .ci/lib.sh", *lines])
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_failing_piece_fails_the_wait_and_every_log_is_printed() -> None:
    result = _pieces("ci_background good bash -c 'echo the good log'",
                     "ci_background bad bash -c 'echo the bad log; exit 3'",
                     "status=0; ci_wait_all || status=$?; echo \"wait returned $status\"")
    assert "the good log" in result.stdout and "the bad log" in result.stdout
    assert "[ci] good: passed" in result.stdout and "[ci] bad: FAILED (exit 3)" in result.stdout
    assert "wait returned 1" in result.stdout


def test_pieces_that_pass_let_the_wait_pass() -> None:
    result = _pieces("ci_background one true", "ci_background two true", "ci_wait_all")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[ci] one: passed" in result.stdout and "[ci] two: passed" in result.stdout


def test_a_piece_takes_ctrl_c_as_from_a_terminal() -> None:
    # Bash starts its background jobs with SIGINT and SIGQUIT ignored; a piece's tests that
    # interrupt a child rely on them being at their default.
    result = _pieces("ci_background signals grep SigIgn /proc/self/status", "ci_wait_all")
    ignored = int(result.stdout.split("SigIgn:")[1].split()[0], 16)
    for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE):
        assert not ignored & (1 << (number - 1)), f"{number.name} ignored: {result.stdout}"


def test_ci_run_starts_the_pieces_before_the_suite_and_waits_for_them_at_the_end() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert script.index("ci_background pythons .ci/pythons.sh") < script.index('eval "$test_command"')
    assert script.rstrip().endswith("ci_wait_all || status=1\nexit $status")
