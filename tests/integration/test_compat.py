"""bmq.compat, the official ``blazingmq`` API on bmq: each behaviour against the embedded broker
and against the real bmqbrkr (``session``-style tests take ``broker_address``).

The official SDK's own integration tests run on bmq.compat too (docs/compat.md says how);
these tests pin what that suite does not: the documented differences, the value classes,
install(), and signature parity with the installed official package.
"""
from __future__ import annotations

import inspect
import itertools
import queue as stdqueue
import subprocess
import sys
import threading
import types
import warnings
import weakref
from pathlib import Path
from typing import Any, Iterator, List

import pytest

import bmq
import bmq.compat as blazingmq
from bmq.compat import session_events as se

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()


def unique_uri(domain: str = "bmq.test.mem.priority") -> str:
    return f"bmq://{domain}/compat-{next(_names)}-{id(object())}"


class Recorder:
    """Collects session events and messages; waits for them with a timeout."""

    def __init__(self) -> None:
        self.events: "stdqueue.Queue[se.SessionEvent]" = stdqueue.Queue()
        self.messages: "stdqueue.Queue[Any]" = stdqueue.Queue()

    def on_event(self, event: se.SessionEvent) -> None:
        self.events.put(event)

    def on_message(self, message: blazingmq.Message, handle: blazingmq.MessageHandle) -> None:
        self.messages.put((message, handle))

    def next_event(self, timeout: float = 10.0) -> se.SessionEvent:
        return self.events.get(timeout=timeout)

    def event_list(self) -> List[se.SessionEvent]:
        found = []
        while not self.events.empty():
            found.append(self.events.get_nowait())
        return found


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def session(broker_address: str, recorder: Recorder) -> Iterator[blazingmq.Session]:
    session = blazingmq.Session(recorder.on_event, recorder.on_message, broker=broker_address)
    yield session
    session.stop()


# ---- the session's life and its events ---------------------------------------------------

def test_connected_then_disconnected_delivered_before_stop_returns(broker_address, recorder):
    session = blazingmq.Session(recorder.on_event, broker=broker_address)
    session.stop()
    session.stop()  # idempotent
    assert recorder.event_list() == [se.Connected(None), se.Disconnected(None)]


def test_methods_after_stop_raise_the_official_error(session):
    uri = unique_uri()
    session.open_queue(uri, write=True)
    session.stop()
    for call in (lambda: session.open_queue(uri, read=True), lambda: session.post(uri, b"x"),
                 lambda: session.close_queue(uri), lambda: session.get_queue_options(uri),
                 lambda: session.configure_queue(uri, blazingmq.QueueOptions())):
        with pytest.raises(blazingmq.Error, match="^Method called after session was stopped$"):
            call()


def test_a_collected_session_warns_and_is_stopped(broker_address, recorder):
    session = blazingmq.Session(recorder.on_event, broker=broker_address)
    ref = weakref.ref(session)
    with pytest.warns(UserWarning, match=r"stop\(\) not invoked before destruction of Session"):
        del session
    assert ref() is None
    assert recorder.next_event() == se.Connected(None)
    assert recorder.next_event() == se.Disconnected(None)


def test_exception_in_a_callback_is_printed_and_dispatching_goes_on(broker_address, capfd):
    seen = []

    def on_event(event):
        seen.append(event)
        raise KeyError("from the callback")

    session = blazingmq.Session(on_event, broker=broker_address)
    session.stop()
    assert seen == [se.Connected(None), se.Disconnected(None)]
    err = capfd.readouterr().err
    assert err.count("Traceback (most recent call last)") == 2 and "from the callback" in err


def test_bad_arguments_raise_before_connecting():
    with pytest.raises(TypeError, match="host_health_monitor"):
        blazingmq.Session(print, host_health_monitor=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        blazingmq.Session(print, timeout=0.0)
    with pytest.raises(ValueError, match="stats_dump_interval"):
        blazingmq.Session(print, stats_dump_interval=-1.0)


def test_unreachable_broker_raises_error():
    with pytest.raises(blazingmq.Error, match="Failed to start session"):
        blazingmq.Session(print, broker="tcp://127.0.0.1:1",
                          timeout=blazingmq.Timeouts(connect_timeout=2.0))


def test_broker_uri_environment_variable_overrides(broker_address, recorder, monkeypatch):
    monkeypatch.setenv("BMQ_BROKER_URI", broker_address)
    with blazingmq.Session(recorder.on_event, broker="tcp://127.0.0.1:1") as session:
        assert session._ext.bmq_session.broker.endswith(broker_address.rsplit(":", 1)[1])


# ---- posting -------------------------------------------------------------------------------

def test_post_with_on_ack_then_consume_with_handle_confirm(session, recorder):
    uri = unique_uri()
    session.open_queue(uri, read=True, write=True)
    acks: "stdqueue.Queue[blazingmq.Ack]" = stdqueue.Queue()
    session.post(uri, b"payload", properties={"n": 7, "s": "text", "b": True, "bin": b"\x00"},
                        property_type_overrides={"n": blazingmq.PropertyType.INT32}, on_ack=acks.put)
    ack = acks.get(timeout=10)
    assert ack.status is blazingmq.AckStatus.SUCCESS and len(ack.guid) == 16 and ack.queue_uri == uri
    assert repr(ack) == f"<Ack[{ack.guid.hex().upper()}] SUCCESS for {uri}>"
    message, handle = recorder.messages.get(timeout=10)
    assert message.data == b"payload" and message.guid == ack.guid and message.queue_uri == uri
    assert message.properties == {"n": 7, "s": "text", "b": True, "bin": b"\x00"}
    assert message.property_types == {"n": blazingmq.PropertyType.INT32, "s": blazingmq.PropertyType.STRING,
                                      "b": blazingmq.PropertyType.BOOL, "bin": blazingmq.PropertyType.BINARY}
    assert repr(message) == f"<Message[{ack.guid.hex().upper()}] for {uri}>"
    assert repr(handle) == f"<MessageHandle[{ack.guid.hex().upper()}] for {uri}>"
    handle.confirm()
    session.close_queue(uri)
    session.open_queue(uri, read=True)  # confirmed: not delivered again
    session.close_queue(uri)
    assert recorder.messages.empty()


def test_an_int_property_is_int64_as_in_the_official_sdk(session, recorder):
    uri = unique_uri()
    session.open_queue(uri, read=True, write=True)
    session.post(uri, b"x", properties={"small": 1})
    message, _ = recorder.messages.get(timeout=10)
    assert message.property_types == {"small": blazingmq.PropertyType.INT64}


@pytest.mark.parametrize("payload, properties, overrides, error, match", [
    (b"", None, None, blazingmq.Error, "Failed to construct message: PAYLOAD_EMPTY"),
    (None, None, None, TypeError, "bytes"),
    (b"x", {"f": 1.5}, None, blazingmq.Error, "float"),
    (b"x", {"a": 1}, {"b": blazingmq.PropertyType.INT32}, blazingmq.Error, "'b'"),
    (b"x", {"n": 2**40}, {"n": blazingmq.PropertyType.INT32}, blazingmq.Error, "not a valid INT32"),
    (b"x", {"s": b"bytes"}, {"s": blazingmq.PropertyType.STRING}, blazingmq.Error, "not a valid STRING"),
])
def test_post_refuses_bad_input(session, payload, properties, overrides, error, match):
    uri = unique_uri()
    session.open_queue(uri, write=True)
    with pytest.raises(error, match=match) as info:
        session.post(uri, payload, properties, overrides)
    assert info.type is error


def test_post_to_a_queue_not_open_or_read_only(session):
    uri = unique_uri()
    with pytest.raises(blazingmq.Error, match="^Queue not opened$"):
        session.post(uri, b"x")
    session.open_queue(uri, read=True)
    with pytest.raises(blazingmq.Error, match="QUEUE_READONLY"):
        session.post(uri, b"x")


def test_close_queue_returns_after_every_on_ack_ran_and_was_released(session):
    uri = unique_uri()
    session.open_queue(uri, write=True)
    release = threading.Event()
    seen: List[blazingmq.Ack] = []

    def on_ack(ack: blazingmq.Ack) -> None:
        release.wait(10)
        seen.append(ack)

    ref = weakref.ref(on_ack)
    for _ in range(3):
        session.post(uri, b"x", on_ack=on_ack)
    del on_ack
    release.set()
    session.close_queue(uri)
    assert len(seen) == 3 and ref() is None


def test_zlib_session_posts_compressed_messages(broker_address, recorder):
    with blazingmq.Session(recorder.on_event, recorder.on_message, broker=broker_address,
                           message_compression_algorithm=blazingmq.CompressionAlgorithmType.ZLIB) as session:
        uri = unique_uri()
        session.open_queue(uri, read=True, write=True)
        acks: "stdqueue.Queue[blazingmq.Ack]" = stdqueue.Queue()
        session.post(uri, b"abc" * 5000, on_ack=acks.put)
        assert acks.get(timeout=10).status is blazingmq.AckStatus.SUCCESS
        message, _ = recorder.messages.get(timeout=10)
        assert message.data == b"abc" * 5000


# ---- queues ------------------------------------------------------------------------------------

@pytest.mark.parametrize("uri, read, write, options, match", [
    ("tcp://localhost:30114", True, True, None, "INVALID_URI: .+"),
    (None, False, False, None, "INVALID_FLAGS: .+"),
    (None, True, False, blazingmq.QueueOptions(max_unconfirmed_messages=-1), "INVALID_ARGUMENT: .+"),
    (None, True, False, blazingmq.QueueOptions(consumer_priority=2**31 - 1), "INVALID_ARGUMENT: .+"),
])
def test_open_queue_errors_name_the_status(session, uri, read, write, options, match):
    uri = uri or unique_uri()
    with pytest.raises(blazingmq.Error, match=f"^Failed to open {uri} queue: {match}") as info:
        session.open_queue(uri, read=read, write=write, options=options or blazingmq.QueueOptions())
    assert info.type is blazingmq.Error


def test_open_twice_is_already_opened(session):
    uri = unique_uri()
    session.open_queue(uri, write=True)
    with pytest.raises(blazingmq.Error, match="ALREADY_OPENED"):
        session.open_queue(uri, write=True)


def test_read_needs_on_message(broker_address, recorder):
    with blazingmq.Session(recorder.on_event, broker=broker_address) as session:
        with pytest.raises(blazingmq.Error, match="on_message"):
            session.open_queue(unique_uri(), read=True)


def test_queue_options_defaults_configure_and_failed_configure(session):
    uri = unique_uri()
    session.open_queue(uri, read=True)
    defaults = blazingmq.QueueOptions(1000, 32 * 1024 * 1024, 0, False)
    assert session.get_queue_options(uri) == defaults
    session.configure_queue(uri, blazingmq.QueueOptions(max_unconfirmed_messages=5, consumer_priority=2))
    assert session.get_queue_options(uri) == blazingmq.QueueOptions(5, 32 * 1024 * 1024, 2, False)
    with pytest.raises(blazingmq.Error, match=f"^Failed to configure {uri} queue: INVALID_ARGUMENT"):
        session.configure_queue(uri, blazingmq.QueueOptions(max_unconfirmed_bytes=-1))
    assert session.get_queue_options(uri) == blazingmq.QueueOptions(5, 32 * 1024 * 1024, 2, False)
    with pytest.raises(blazingmq.Error, match="^Queue not opened$"):
        session.configure_queue(unique_uri(), blazingmq.QueueOptions())


def test_a_writer_reports_default_consumption_options(session):
    uri = unique_uri()
    session.open_queue(uri, write=True, options=blazingmq.QueueOptions(0, 0, 0))
    assert session.get_queue_options(uri) == blazingmq.QueueOptions(1000, 32 * 1024 * 1024, 0, False)


# ---- where bmq.compat differs: callbacks may call the session ---------------------------------

def test_a_callback_may_open_close_and_stop(broker_address, recorder):
    done = threading.Event()
    holder: List[blazingmq.Session] = []
    errors: List[BaseException] = []

    def on_message(message: blazingmq.Message, handle: blazingmq.MessageHandle) -> None:
        try:
            session = holder[0]
            handle.confirm()
            other = unique_uri()
            session.open_queue(other, write=True)  # the official SDK deadlocks here
            session.close_queue(message.queue_uri)
            session.stop()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            done.set()

    session = blazingmq.Session(recorder.on_event, on_message, broker=broker_address)
    holder.append(session)
    uri = unique_uri()
    session.open_queue(uri, read=True, write=True)
    session.post(uri, b"x")
    assert done.wait(20) and not errors
    session.stop()  # returns once the stop begun in the callback is complete
    assert recorder.event_list()[-1] == se.Disconnected(None)


# ---- host health ------------------------------------------------------------------------------

def test_host_health_suspends_and_resumes_queues(broker_address, recorder):
    monitor = blazingmq.BasicHealthMonitor()
    with blazingmq.Session(recorder.on_event, recorder.on_message, broker=broker_address,
                           host_health_monitor=monitor) as session:
        assert recorder.next_event() == se.Connected(None)
        uri = unique_uri()
        session.open_queue(uri, write=True, options=blazingmq.QueueOptions(suspends_on_bad_host_health=True))
        monitor.set_unhealthy()
        assert recorder.next_event() == se.HostUnhealthy(None)
        assert recorder.next_event() == se.QueueSuspended(uri)
        with pytest.raises(blazingmq.Error, match="QUEUE_SUSPENDED"):
            session.post(uri, b"x")
        monitor.set_healthy()
        assert recorder.next_event() == se.QueueResumed(uri)
        assert recorder.next_event() == se.HostHealthRestored(None)
        session.post(uri, b"x")


def test_a_host_unhealthy_at_start_is_reported_after_connected(broker_address, recorder):
    monitor = blazingmq.testing.HostHealth()
    monitor.set_unhealthy()
    with blazingmq.Session(recorder.on_event, broker=broker_address, host_health_monitor=monitor):
        assert recorder.next_event() == se.Connected(None)
        assert recorder.next_event() == se.HostUnhealthy(None)


def test_suspension_needs_a_monitor(session):
    with pytest.raises(blazingmq.Error, match="host_health_monitor"):
        session.open_queue(unique_uri(), write=True,
                                  options=blazingmq.QueueOptions(suspends_on_bad_host_health=True))


# ---- values --------------------------------------------------------------------------------------

def test_event_equality_and_reprs():
    assert se.Connected(None) == se.Connected(None) and se.Connected(None) != se.Disconnected(None)
    assert se.Error("boom") != se.Error("bang") and repr(se.Error("boom")) == "<Error: boom>"
    assert repr(se.Connected(None)) == "<Connected>"
    assert se.QueueSuspended("bmq://d/q") == se.QueueSuspended("bmq://d/q")
    assert se.QueueSuspended("bmq://d/q") != se.QueueSuspended("bmq://d/r")
    assert repr(se.QueueReopenFailed("bmq://d/q", "why")) == "<QueueReopenFailed: bmq://d/q why>"
    assert repr(se.QueueResumed("bmq://d/q")) == "<QueueResumed: bmq://d/q>"


def test_option_values():
    assert blazingmq.Timeouts(connect_timeout=1.0) == blazingmq.Timeouts(connect_timeout=1.0)
    assert repr(blazingmq.Timeouts(close_queue_timeout=2)) == "Timeouts(close_queue_timeout=2)"
    assert repr(blazingmq.QueueOptions(consumer_priority=3)) == "QueueOptions(consumer_priority=3)"
    assert blazingmq.QueueOptions(1) != blazingmq.QueueOptions(2)
    assert repr(blazingmq.SessionOptions(num_processing_threads=2)) == "SessionOptions(num_processing_threads=2)"
    assert repr(blazingmq.AckStatus.SUCCESS) == "<AckStatus.SUCCESS>"
    for cls in (blazingmq.Message, blazingmq.MessageHandle, blazingmq.Ack):
        with pytest.raises(blazingmq.Error):
            cls()


def test_with_options(broker_address, recorder):
    options = blazingmq.SessionOptions(timeouts=blazingmq.Timeouts(open_queue_timeout=5.0),
                                       event_queue_watermarks=(10, 100))
    session = blazingmq.Session.with_options(recorder.on_event, broker=broker_address, session_options=options)
    session.stop()
    assert recorder.event_list() == [se.Connected(None), se.Disconnected(None)]


# ---- install() and parity with the official package ---------------------------------------------

def test_install_registers_the_package_and_its_submodules():
    name = "blazingmq_compat_test_alias"
    try:
        assert blazingmq.install(name) is blazingmq
        assert blazingmq.install(name) is blazingmq  # idempotent
        assert sys.modules[f"{name}.session_events"] is se
        assert sys.modules[f"{name}.testing"].HostHealth is blazingmq.BasicHealthMonitor
    finally:
        for key in [key for key in sys.modules if key == name or key.startswith(name + ".")]:
            del sys.modules[key]


def test_install_refuses_when_another_module_has_the_name():
    sys.modules["compat_taken_name"] = types.ModuleType("compat_taken_name")
    try:
        with pytest.raises(RuntimeError, match="already imported"):
            blazingmq.install("compat_taken_name")
    finally:
        del sys.modules["compat_taken_name"]


def test_install_makes_unchanged_code_run_on_bmq(broker_address):
    program = (
        "import bmq.compat; bmq.compat.install()\n"
        "import queue, blazingmq\n"
        "from blazingmq.session_events import log_session_event\n"
        "acks = queue.Queue()\n"
        f"with blazingmq.Session(log_session_event, broker={broker_address!r}) as s:\n"
        "    s.open_queue('bmq://bmq.test.mem.priority/compat-install', write=True)\n"
        "    s.post('bmq://bmq.test.mem.priority/compat-install', b'x', on_ack=acks.put)\n"
        "    print(type(s).__module__, acks.get(timeout=10).status)\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                            cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["bmq.compat._session", "AckStatus.SUCCESS"] and result.stderr == ""


def test_the_public_names_and_signatures_are_the_official_packages():
    official = pytest.importorskip("blazingmq", reason="the official blazingmq SDK is not installed")
    if official is blazingmq:
        pytest.skip("blazingmq is bmq.compat in this process")
    assert set(official.__all__) == set(blazingmq.__all__)
    assert set(official.session_events.__all__ if hasattr(official.session_events, "__all__") else []) <= set(
        se.__all__)
    for name in ("Connected", "Disconnected", "ConnectionLost", "Reconnected", "StateRestored", "ConnectionTimeout",
                 "HostUnhealthy", "HostHealthRestored", "QueueSuspended", "QueueSuspendFailed", "QueueResumed",
                 "QueueResumeFailed", "QueueReopened", "QueueReopenFailed", "SlowConsumerNormal",
                 "SlowConsumerHighWaterMark", "Error", "InterfaceError", "log_session_event"):
        assert hasattr(official.session_events, name) and hasattr(se, name), name
    for cls, methods in ((official.Session, ("__init__", "with_options", "open_queue", "close_queue",
                                             "configure_queue", "get_queue_options", "stop", "post", "confirm")),
                         (official.QueueOptions, ("__init__",)), (official.SessionOptions, ("__init__",)),
                         (official.Timeouts, ("__init__",))):
        ours = getattr(blazingmq, cls.__name__)
        for method in methods:
            theirs_sig = inspect.signature(getattr(cls, method))
            ours_sig = inspect.signature(getattr(ours, method))
            assert list(theirs_sig.parameters) == list(ours_sig.parameters), (cls.__name__, method)
            for param in theirs_sig.parameters.values():
                default = ours_sig.parameters[param.name].default
                if isinstance(param.default, (int, float, str, type(None))) and not isinstance(param.default, bool):
                    assert default == param.default or repr(default) == repr(param.default), (method, param.name)
    for name in ("DEFAULT_MAX_UNCONFIRMED_MESSAGES", "DEFAULT_MAX_UNCONFIRMED_BYTES", "DEFAULT_CONSUMER_PRIORITY",
                 "DEFAULT_SUSPENDS_ON_BAD_HOST_HEALTH"):
        assert getattr(blazingmq.QueueOptions, name) == getattr(official.QueueOptions, name)
    for enum in ("AckStatus", "CompressionAlgorithmType", "PropertyType"):
        assert {m.name for m in getattr(official, enum)} == {m.name for m in getattr(blazingmq, enum)}, enum


def test_public_api_is_documented_with_args_returns_raises():
    missing = []
    for name in blazingmq.__all__:
        obj = getattr(blazingmq, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)) or obj in (blazingmq.AckStatus,
                                                                               blazingmq.CompressionAlgorithmType,
                                                                               blazingmq.PropertyType):
            continue
        if not inspect.getdoc(obj):
            missing.append(name)
        for attr, member in vars(obj).items() if inspect.isclass(obj) else ():
            if not attr.startswith("_") and (inspect.isfunction(member) or isinstance(member, (property, classmethod))):
                if not inspect.getdoc(member.__func__ if isinstance(member, classmethod) else member):
                    missing.append(f"{name}.{attr}")
    for method in ("open_queue", "close_queue", "configure_queue", "post", "confirm"):
        doc = inspect.getdoc(getattr(blazingmq.Session, method)) or ""
        assert "Raises:" in doc and "Args:" in doc, method
    assert "Returns:" in (inspect.getdoc(blazingmq.Session.get_queue_options) or "")
    assert not missing, missing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert inspect.getdoc(blazingmq.install) and "Raises:" in inspect.getdoc(blazingmq.install)
    assert isinstance(bmq.compat.exceptions.BrokerTimeoutError("x"), blazingmq.Error)


def test_bmq_session_call_soon_runs_after_queued_callbacks_on_the_dispatcher(broker_address):
    # bmq core API used by bmq.compat to run a batch's on_ack callbacks where the others run.
    order: List[str] = []
    done = threading.Event()
    with bmq.Session(broker_address) as native:
        queue = native.open_queue(unique_uri(), write=True)
        queue.post_async(b"x", on_ack=lambda ack: order.append(threading.current_thread().name))
        native.flush(10)
        native.call_soon(lambda tag: (order.append(tag), done.set()), "soon")
        assert done.wait(10)
        assert order[0].startswith("bmq-dispatcher") and order[1] == "soon"
    with pytest.raises(bmq.SessionClosedError):
        native.call_soon(print)


def test_stop_right_after_many_posts_answers_every_on_ack_first(session):
    uri = unique_uri()
    session.open_queue(uri, write=True)
    statuses: List[blazingmq.AckStatus] = []
    for _ in range(5000):
        session.post(uri, b"x" * 100, on_ack=lambda ack: statuses.append(ack.status))
    session.stop()
    assert len(statuses) == 5000
    assert set(statuses) <= {blazingmq.AckStatus.SUCCESS, blazingmq.AckStatus.NOT_CONNECTED}
