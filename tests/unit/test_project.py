"""Project-level promises: the README's test command is what CI runs; the CLI parses options."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import threading

from bmq import _bench
from bmq.cli import CommandError, build_parser, parse_property

ROOT = Path(__file__).resolve().parents[2]


def readme_test_command() -> str:
    # the same extraction .ci/run performs
    script = ROOT / ".ci" / "run"
    awk = next(line for line in script.read_text().splitlines() if line.startswith("test_command=$(awk"))
    program = awk[awk.index("'") + 1: awk.rindex("'")]
    return subprocess.run(["awk", program, str(ROOT / "README.md")], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_ci_runs_the_readme_test_command():
    command = readme_test_command()
    assert "pytest" in command and "pip install" in command
    assert command in (ROOT / "README.md").read_text()


def test_readme_first_command_installs_and_runs_the_main_job():
    text = (ROOT / "README.md").read_text()
    assert "pip install . && bmq bench" in text


@pytest.mark.parametrize("text, expected", [
    ("kind=new", ("kind", "new", "STRING")),
    ("n:int32=7", ("n", 7, "INT32")),
    ("n:int64=0x10", ("n", 16, "INT64")),
    ("ok:bool=false", ("ok", False, "BOOL")),
    ("c:char=A", ("c", b"A", "CHAR")),
    ("b:binary=00ff", ("b", b"\x00\xff", "BINARY")),
    ("empty=", ("empty", "", "STRING")),
])
def test_parse_property(text, expected):
    assert parse_property(text) == expected


@pytest.mark.parametrize("text", ["novalue", "=x", "n:float=1", "n:int32=x", "ok:bool=maybe", "b:binary=zz"])
def test_parse_property_rejects(text):
    with pytest.raises(CommandError, match="--property"):
        parse_property(text)


def test_every_client_command_takes_broker():
    parser = build_parser()
    for argv in (["post", "bmq://d/q"], ["consume", "bmq://d/q"], ["bench"]):
        args = parser.parse_args([*argv, "--broker", "tcp://h:1"])
        assert args.broker == "tcp://h:1"


def test_bench_worker_failure_wakes_the_run_and_is_reraised():
    collector = _bench._Collector(expected=10, start_ns=0)
    workers = _bench._Workers(collector)
    started = threading.Event()

    def fail() -> None:
        started.set()
        raise RuntimeError("producer died")

    workers.start("t", fail)
    workers.join(5)
    assert started.is_set() and collector.done.is_set()  # a waiting run is woken, not left hanging
    with pytest.raises(RuntimeError, match="producer died"):
        workers.raise_if_failed()
