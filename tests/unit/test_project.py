"""Project-level promises: the README's test command is what CI runs; the CLI parses options."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import threading

from bmq import _bench
from bmq.cli import CommandError, build_parser, parse_property

ROOT = Path(__file__).resolve().parents[2]


def readme_block(marker: str) -> str:
    """The README block after ``<!-- marker -->``, extracted by .ci/run's own function."""
    script = (ROOT / ".ci" / "run").read_text()
    function = script[script.index("readme_block() {"): script.index("\n}\n", script.index("readme_block() {")) + 3]
    return subprocess.run(["bash", "-c", f"{function}\nreadme_block {marker}"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_ci_runs_the_readme_test_command():
    command = readme_block("test-command")
    assert "pytest" in command and "pip install" in command
    assert command in (ROOT / "README.md").read_text()
    assert 'eval "$test_command"' in (ROOT / ".ci" / "run").read_text()


def test_ci_runs_the_readme_main_command_in_a_fresh_venv():
    assert readme_block("main-command") == "pip install . && bmq bench"
    script = (ROOT / ".ci" / "run").read_text()
    assert "-m venv" in script and 'eval "$main_command"' in script


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
        assert args.broker == ["tcp://h:1"]
        args = parser.parse_args([*argv, "--broker", "tcp://h:1", "--broker", "tcp://h:2"])
        assert args.broker == ["tcp://h:1", "tcp://h:2"]


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


def test_version_option_prints_the_version(capsys):
    from bmq import __version__

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"bmq {__version__}"


def test_changelog_has_the_current_version_and_the_deprecation_policy():
    from bmq import __version__

    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = [line for line in changelog.splitlines() if line.startswith("## ")]
    assert "## Deprecation policy" in headings and "## Unreleased" in headings
    assert any(line.split()[1] == __version__ for line in headings if line[3:4].isdigit()), headings
    assert "DeprecationWarning" in changelog


def test_release_tooling_stays_out_of_the_core_dependencies():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert sorted(dep.split(">")[0] for dep in project["dependencies"]) == ["crc32c", "zstandard"]
    release = " ".join(project["optional-dependencies"]["release"])
    assert all(tool in release for tool in ("build", "twine", "auditwheel", "bmq[docs]"))
    assert "sphinx" in " ".join(project["optional-dependencies"]["docs"])
