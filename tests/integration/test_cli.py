"""The ``bmq`` command line, driven as a subprocess against an embedded broker."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from bmq.broker import Broker
from support import sigint_at_default

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(*args: str, timeout: float = 120, stdin: bytes = b"", **environment: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(environment)
    return subprocess.run([sys.executable, "-m", "bmq", *args], input=stdin, capture_output=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def broker():
    with Broker() as embedded:
        yield embedded


def test_post_then_consume_round_trips_payloads_and_properties(broker):
    uri = "bmq://bmq.test.mem.priority/cli-roundtrip"
    posted = run_cli("post", uri, "--broker", broker.address, "--count", "50", "--size", "32",
                     "--property", "kind=order", "--property", "n:int32=7", "--property", "flag:bool=true",
                     "--property", "blob:binary=00ff10", "--property", "tag:binary=0xBEEF")
    assert posted.returncode == 0, posted.stderr.decode()
    assert b"50 acked, 0 failed" in posted.stdout

    consumed = run_cli("consume", uri, "--broker", broker.address, "--count", "50", "--timeout", "10")
    assert consumed.returncode == 0, consumed.stderr.decode()
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert len(records) == 50
    expected = sorted((b"%010d" % i).ljust(32, b".").decode() for i in range(50))
    assert sorted(r["data"] for r in records) == expected
    for record in records:
        assert record["properties"] == {"kind": "order", "n": 7, "flag": True, "blob": "AP8Q", "tag": "vu8="}
        assert record["property_types"] == {"kind": "STRING", "n": "INT32", "flag": "BOOL", "blob": "BINARY",
                                            "tag": "BINARY"}
        assert len(record["guid"]) == 32
    # everything was confirmed: nothing left for a second consumer
    again = run_cli("consume", uri, "--broker", broker.address, "--timeout", "0.5")
    assert again.returncode == 0 and again.stdout == b""


def test_post_stdin_lines_compressed(broker):
    uri = "bmq://bmq.test.mem.priority/cli-stdin"
    posted = run_cli("post", uri, "--broker", broker.address, "--stdin", "--compression", "zlib",
                     stdin=b"alpha\nbeta\n" + b"g" * 3000 + b"\n")
    assert posted.returncode == 0, posted.stderr.decode()
    assert [m.compression for m in broker.queue_messages(uri)] == [0, 0, 1]  # only >= 1 KiB is compressed
    consumed = run_cli("consume", uri, "--broker", broker.address, "--count", "3")
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert sorted(json.loads(line)["data"] for line in consumed.stdout.splitlines()) == ["alpha", "beta", "g" * 3000]


def test_raw_output_is_the_exact_payload(broker, tmp_path):
    uri = "bmq://bmq.test.mem.priority/cli-raw"
    source = tmp_path / "in.bin"
    source.write_bytes(bytes(range(256)) * 16 + b"\n")
    assert run_cli("post", uri, "--broker", broker.address, "--file", str(source)).returncode == 0
    consumed = run_cli("consume", uri, "--broker", broker.address, "--count", "1", "--output", "raw")
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert consumed.stdout == source.read_bytes()


def test_raw_output_of_many_stops_at_count_and_leaves_the_rest(broker):
    import bmq

    uri = "bmq://bmq.test.mem.priority/cli-raw-many"
    payloads = [b"%d:" % i + b"x" * (i % 7 + 1) for i in range(500)]
    with bmq.Session(broker.address) as session:
        session.open_queue(uri, write=True).post_many(payloads)
    consumed = run_cli("consume", uri, "--broker", broker.address, "--count", "300", "--output", "raw")
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert consumed.stdout == b"".join(payloads[:300])  # in order, back to back, exactly 300
    rest = run_cli("consume", uri, "--broker", broker.address, "--count", "200", "--output", "raw")
    assert rest.stdout == b"".join(payloads[300:])  # the first 300 were confirmed, none twice


def test_bench_writes_json_with_documented_keys_and_each_sessions_stats(tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli("bench", "--count", "2000", "--size", "64", "--json", str(out), "--stats")
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(out.read_text())
    (bmq_side,) = report["results"]
    assert bmq_side["client"] == "bmq"
    assert bmq_side["acked"] == 2000 and bmq_side["received"] == 2000
    assert bmq_side["e2e_msgs_per_s"] > 0 and bmq_side["post_msgs_per_s"] > 0
    assert set(bmq_side["latency_us"]) == {"p50", "p90", "p99", "p99.9", "max"}
    assert bmq_side["latency_us"]["p50"] <= bmq_side["latency_us"]["p99"]
    assert {"python", "platform", "cpus"} <= set(report["machine"])
    assert b"e2e msg/s" in result.stdout
    first = result.stdout.decode().splitlines()[0]
    assert first.startswith("bmq bench: via a temporary embedded broker at tcp://127.0.0.1:"), first
    assert report["broker"] in first
    # --stats: the producer's session, then the consumer's (posted/acked; pushed/confirmed).
    producer, consumer = [line.split() for line in result.stderr.decode().splitlines()
                          if line.startswith("bmq://bmq.test.mem.priority/bmq-cli")]
    assert producer[1:3] == ["2,000", "2,000"] and consumer[5:7] == ["2,000", "2,000"]


def test_bad_uri_is_a_one_line_error_with_exit_code_2(broker):
    result = run_cli("post", "bmq:/missing-slash", "--broker", broker.address)
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in lines[0]


def test_unreachable_broker_is_a_one_line_error_with_exit_code_2():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    result = run_cli("post", "bmq://bmq.test.mem.priority/x", "--broker", f"tcp://127.0.0.1:{port}", timeout=60)
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0]
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("argv", [
    ["post", "bmq://bmq.test.mem.priority/x", "--timeout", "-1"],
    ["post", "bmq://bmq.test.mem.priority/x", "--timeout", "0"],
    ["post", "bmq://bmq.test.mem.priority/x", "--rate", "-5"],
    ["post", "bmq://bmq.test.mem.priority/x", "--count", "0"],
    ["consume", "bmq://bmq.test.mem.priority/x", "--count", "-3"],
    ["bench", "--size", "70000000"],
    ["bench", "--size", "4"],
])
def test_nonsensical_numbers_are_one_line_errors_before_anything_is_sent(argv):
    result = run_cli(*argv, "--broker", "tcp://127.0.0.1:1")
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in lines[0], lines


def test_bad_property_is_rejected_before_connecting():
    result = run_cli("post", "bmq://bmq.test.mem.priority/x", "--broker", "tcp://127.0.0.1:1",
                     "--property", "n:int32=notanumber")
    assert result.returncode == 2
    assert "n:int32=notanumber" in result.stderr.decode()


def test_auth_takes_the_secret_from_the_environment_only():
    with Broker(authenticators={"BASIC": {"cli": "s3cret"}}, allow_anonymous=False) as secured:
        uri = "bmq://bmq.test.mem.priority/cli-auth"
        missing = run_cli("post", uri, "--broker", secured.address, "--auth", "BASIC")
        assert missing.returncode == 2 and b"BMQ_AUTH_DATA" in missing.stderr
        wrong = run_cli("post", uri, "--broker", secured.address, "--auth", "BASIC", BMQ_AUTH_DATA="cli:wrong")
        posted = run_cli("post", uri, "--broker", secured.address, "--auth", "BASIC", "--count", "3",
                         BMQ_AUTH_DATA="cli:s3cret")
        consumed = run_cli("consume", uri, "--broker", secured.address, "--auth", "basic", "--count", "3",
                           BMQ_AUTH_DATA="cli:s3cret")
    assert wrong.returncode == 2 and b"refused BASIC authentication" in wrong.stderr
    assert b"wrong" not in wrong.stderr.replace(b"refused", b"")
    assert posted.returncode == 0 and b"3 acked, 0 failed" in posted.stdout, posted.stderr
    assert consumed.returncode == 0 and len(consumed.stdout.splitlines()) == 3, consumed.stderr


def test_stats_prints_the_final_statistics(broker):
    uri = "bmq://bmq.test.mem.priority/cli-stats"
    posted = run_cli("post", uri, "--broker", broker.address, "--count", "7", "--stats")
    assert posted.returncode == 0, posted.stderr
    line = next(line for line in posted.stderr.decode().splitlines() if line.startswith(uri))
    assert line.split()[1:4] == ["7", "7", "0"]  # posted, acked, nacked
    consumed = run_cli("consume", uri, "--broker", broker.address, "--count", "7", "--stats")
    line = next(line for line in consumed.stderr.decode().splitlines() if line.startswith(uri))
    assert line.split()[5:7] == ["7", "7"]  # pushed, confirmed


def test_tls_options_post_and_consume_through_a_tls_broker(certificates):
    from bmq.broker import tls_server_context

    uri = "bmq://bmq.test.mem.priority/cli-tls"
    tls = ["--tls-ca", str(certificates["ca"]), "--tls-cert", str(certificates["client"]),
           "--tls-key", str(certificates["client.key"])]
    context = tls_server_context(certificates["server"], certificates["server.key"], client_ca_file=certificates["ca"])
    with Broker(tls=context) as secure:
        posted = run_cli("post", uri, "--broker", secure.address, "--count", "5", *tls)
        assert posted.returncode == 0, posted.stderr.decode()
        consumed = run_cli("consume", uri, "--broker", secure.address, "--count", "5", "--timeout", "10", *tls)
        assert consumed.returncode == 0 and len(consumed.stdout.splitlines()) == 5, consumed.stderr.decode()
        # Without TLS, or with a CA that did not sign the broker's certificate: one line, exit 2.
        for extra in ([], ["--tls-ca", str(certificates["other-ca"])]):
            refused = run_cli("post", uri, "--broker", secure.address, *extra, timeout=60)
            lines = refused.stderr.decode().strip().splitlines()
            assert refused.returncode == 2 and len(lines) == 1 and "TLS" in lines[0], lines
    no_ca = run_cli("post", uri, "--tls-cert", str(certificates["client"]))
    assert no_ca.returncode == 2 and b"--tls-ca" in no_ca.stderr


def test_admin_command_and_helpers(broker):
    uri = "bmq://bmq.test.mem.priority/cli-admin"
    posted = run_cli("post", uri, "--broker", broker.address, "--count", "3", "--size", "10")
    assert posted.returncode == 0, posted.stderr.decode()

    raw = run_cli("admin", "--broker", broker.address, "help")  # the words form one command
    assert raw.returncode == 0, raw.stderr.decode()
    assert "STAT SHOW" in json.loads(raw.stdout)["help"]["commands"][-1]["command"]

    stats = run_cli("admin", "--broker", broker.address, "--queue-stats", uri, "--json")
    assert stats.returncode == 0, stats.stderr.decode()
    record = json.loads(stats.stdout)
    assert (record["uri"], record["messages"], record["bytes"]) == (uri, 3, 30)
    assert record["apps"]["__default"] == {"app_id": "__default", "messages": 3, "consumers": 0}

    queues = run_cli("admin", "--broker", broker.address, "--queues", "bmq.test.mem.priority")
    assert queues.returncode == 0 and uri in queues.stdout.decode().split()

    purged = run_cli("admin", "--broker", broker.address, "--purge", uri)
    assert purged.returncode == 0, purged.stderr.decode()
    assert purged.stdout.decode().strip() == f"purged 3 messages (30 bytes) from {uri}"
    assert broker.queue_messages(uri) == []


def test_admin_errors(broker):
    refused = run_cli("admin", "--broker", broker.address, "CLUSTERS", "LIST")
    assert refused.returncode == 1
    assert b"AdminCommandError" in refused.stderr and b"does not support" in refused.stderr
    nothing = run_cli("admin", "--broker", broker.address)
    assert nothing.returncode == 2 and b"give either an admin command" in nothing.stderr
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    unreachable = run_cli("admin", "--broker", f"tcp://127.0.0.1:{port}", "HELP", "--timeout", "5")
    assert unreachable.returncode == 2 and b"cannot connect" in unreachable.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_post_and_consume_use_the_broker_named_by_BMQ_BROKER_URI(broker_address):
    uri = f"bmq://bmq.test.mem.priority/cli-env-{time.monotonic_ns()}"
    posted = run_cli("post", uri, "--count", "3", BMQ_BROKER_URI=broker_address)
    assert posted.returncode == 0 and b"3 acked, 0 failed" in posted.stdout, posted.stderr.decode()
    # The messages stayed in that broker: a second command finds them.
    consumed = run_cli("consume", uri, "--count", "3", "--timeout", "10", BMQ_BROKER_URI=broker_address)
    assert consumed.returncode == 0 and len(consumed.stdout.splitlines()) == 3, consumed.stderr.decode()


def test_broker_option_wins_over_BMQ_BROKER_URI(broker_address):
    uri = f"bmq://bmq.test.mem.priority/cli-env-override-{time.monotonic_ns()}"
    posted = run_cli("post", uri, "--broker", broker_address, BMQ_BROKER_URI=f"tcp://127.0.0.1:{free_port()}")
    assert posted.returncode == 0 and b"1 acked" in posted.stdout, posted.stderr.decode()


def test_admin_uses_BMQ_BROKER_URI(broker_address):
    answer = run_cli("admin", "HELP", BMQ_BROKER_URI=broker_address)
    assert answer.returncode == 0 and b"STAT SHOW" in answer.stdout, answer.stderr.decode()


def test_the_default_broker_is_tcp_localhost_30114(monkeypatch):
    from bmq import cli

    monkeypatch.delenv("BMQ_BROKER_URI", raising=False)
    for command in (["post", "bmq://d/q"], ["consume", "bmq://d/q"], ["admin", "HELP"]):
        addresses, source = cli.broker_choice(cli.build_parser().parse_args(command))
        assert addresses == ["tcp://localhost:30114"] and "BMQ_BROKER_URI unset" in source
        assert cli.broker_choice(cli.build_parser().parse_args(command + ["--embedded"]))[0] is None
    monkeypatch.setenv("BMQ_BROKER_URI", "tcp://elsewhere:1234")
    assert cli.broker_choice(cli.build_parser().parse_args(["post", "bmq://d/q"]))[0] == ["tcp://elsewhere:1234"]


@pytest.mark.parametrize("command", [["post", "bmq://bmq.test.mem.priority/x"], ["admin", "HELP"]])
def test_an_unreachable_broker_from_the_environment_is_one_line_naming_it(command):
    port = free_port()
    result = run_cli(*command, BMQ_BROKER_URI=f"tcp://127.0.0.1:{port}", timeout=60)
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, lines
    assert f"127.0.0.1:{port}" in lines[0] and "BMQ_BROKER_URI" in lines[0]


def test_embedded_starts_a_temporary_broker_only_when_asked(broker):
    uri = "bmq://bmq.test.mem.priority/cli-embedded"
    posted = run_cli("post", uri, "--embedded", "--count", "2", BMQ_BROKER_URI=broker.address)
    assert posted.returncode == 0 and b"2 acked" in posted.stdout, posted.stderr.decode()
    assert broker.queue_messages(uri) == []  # they went to the temporary broker, not to $BMQ_BROKER_URI's
    both = run_cli("post", uri, "--embedded", "--broker", broker.address)
    assert both.returncode == 2 and b"not allowed with" in both.stderr


def test_bench_first_line_names_the_broker_given(broker_address):
    result = run_cli("bench", "--broker", broker_address, "--count", "200", "--size", "16",
                     "--uri", f"bmq://bmq.test.mem.priority/cli-bench-{time.monotonic_ns()}")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().splitlines()[0] == f"bmq bench: via broker {broker_address} (--broker)"


def test_a_peer_that_is_not_a_broker_is_one_line_saying_so():
    from tests.integration.test_not_a_broker import HTTP_ANSWER, AnsweringServer

    server = AnsweringServer(HTTP_ANSWER)
    try:
        for command in (["post", "bmq://bmq.test.mem.priority/x"], ["admin", "HELP"]):
            result = run_cli(*command, "--broker", server.address, "--connect-timeout", "20", timeout=60)
            lines = result.stderr.decode().strip().splitlines()
            assert result.returncode == 2 and len(lines) == 1, lines
            assert "not a BlazingMQ broker" in lines[0] and "HTTP/1.1 400 Bad Request" in lines[0]
    finally:
        server.close()


@pytest.mark.parametrize("text", ["b:binary=00ff10", "b:binary=0x00FF10", "b:binary=0X00ff10", "b:binary=00 ff 10"])
def test_binary_properties_are_hex_with_or_without_0x(text):
    from bmq.cli import parse_property

    assert parse_property(text) == ("b", b"\x00\xff\x10", "BINARY")


def test_a_binary_property_that_is_not_hex_says_what_is_expected():
    result = run_cli("post", "bmq://bmq.test.mem.priority/x", "--broker", "tcp://127.0.0.1:1",
                     "--property", "b:binary=0xZZ")
    assert result.returncode == 2 and b"hex digits, with or without 0x" in result.stderr


def closed_pipe() -> int:
    """The write end of a pipe whose reader is already gone (as after ``| head`` exits)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


def test_output_to_a_closed_pipe_ends_quietly_and_confirms_nothing_unwritten(broker_address):
    uri = f"bmq://bmq.test.mem.priority/cli-closed-pipe-{time.monotonic_ns()}"
    assert run_cli("post", uri, "--broker", broker_address, "--count", "3").returncode == 0
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for command in (["admin", "--broker", broker_address, "HELP"],
                    ["consume", uri, "--broker", broker_address, "--count", "3", "--timeout", "10"]):
        stdout = closed_pipe()
        try:
            result = subprocess.run([sys.executable, "-m", "bmq", *command], stdout=stdout, stderr=subprocess.PIPE,
                                    timeout=120, env=env, cwd=ROOT)
        finally:
            os.close(stdout)
        assert result.returncode == 141 and result.stderr == b"", (command, result.stderr.decode())
    # What could not be written stays in the queue.
    rest = run_cli("consume", uri, "--broker", broker_address, "--count", "3", "--timeout", "10")
    assert rest.returncode == 0 and len(rest.stdout.splitlines()) == 3, rest.stderr.decode()


def test_plot_without_matplotlib_fails_before_running(tmp_path):
    (tmp_path / "matplotlib.py").write_text("raise ImportError('hidden by the test')\n")
    result = run_cli("bench", "--count", "100", "--plot", str(tmp_path / "out.png"),
                     PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "--plot needs matplotlib" in lines[0], lines
    assert result.stdout == b""  # no broker started, nothing measured


def test_connect_timeout_bounds_a_broker_that_never_answers():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; nobody answers
        address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        result = run_cli("post", "bmq://bmq.test.mem.priority/x", "--broker", address, "--connect-timeout", "1",
                         timeout=60)
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "within 1 s" in lines[0], lines
    assert time.monotonic() - started < 30


def test_ctrl_c_during_post_says_how_many_were_acknowledged(broker_address):
    import bmq

    uri = f"bmq://bmq.test.mem.priority/cli-interrupted-{time.monotonic_ns()}"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with bmq.Session(broker_address) as session:
        consumer = session.open_queue(uri, read=True)
        # 20 messages per batch at 200/s; a poster sends a batch once the previous one is all
        # acknowledged, so the 21st message here proves 20 acknowledged.
        post = subprocess.Popen([sys.executable, "-m", "bmq", "post", uri, "--broker", broker_address,
                                 "--count", "100000", "--rate", "200"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=ROOT, preexec_fn=sigint_at_default)
        try:
            for _ in range(21):
                message = consumer.get(timeout=60)
                assert message is not None, post.stderr.read1(4096) if post.poll() is not None else "no message"
                message.confirm()
            post.send_signal(signal.SIGINT)
            out, err = post.communicate(timeout=60)
        finally:
            post.kill()  # a no-op once it has exited
        received = 21
        while consumer.get(timeout=2) is not None:  # what the broker stored before the session stopped
            received += 1
    assert post.returncode == 130, err.decode()
    match = re.fullmatch(r"bmq post: interrupted: (\d+) of 100000 messages acknowledged by the broker(, \d+ posted "
                         r"without an answer yet \(the broker may have stored them\))?\n", err.decode())
    assert match, err.decode()
    assert 20 <= int(match.group(1)) <= received
    assert out == b""
