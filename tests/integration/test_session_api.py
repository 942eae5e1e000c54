"""The public client API is documented: docstrings everywhere, a thread-safety line on every
public class, Args/Returns/Raises where a method takes arguments or raises."""
from __future__ import annotations

import inspect

import pytest

import bmq
from bmq import events

CLIENT_CLASSES = [
    bmq.Session,
    bmq.Queue,
    bmq.Message,
    bmq.Ack,
    bmq.SessionOptions,
    bmq.QueueOptions,
    bmq.ReconnectPolicy,
    bmq.HostHealthMonitor,
    bmq.ManualHostHealthMonitor,
]


def public_methods(cls):
    for name, member in vars(cls).items():
        if name.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
            continue
        yield name, member


@pytest.mark.parametrize("cls", CLIENT_CLASSES, ids=lambda c: c.__name__)
def test_public_classes_state_their_thread_safety(cls):
    doc = inspect.getdoc(cls) or ""
    assert "Thread-safety:" in doc, f"{cls.__name__} docstring lacks a Thread-safety line"


@pytest.mark.parametrize("cls", CLIENT_CLASSES, ids=lambda c: c.__name__)
def test_public_methods_have_docstrings(cls):
    missing = [name for name, member in public_methods(cls) if not inspect.getdoc(member)]
    assert not missing, f"{cls.__name__}: undocumented {missing}"


@pytest.mark.parametrize("method", [bmq.Session.open_queue, bmq.Session.post, bmq.Queue.post_async,
                                    bmq.Queue.post_many, bmq.Session.close_queue, bmq.Session.configure_queue])
def test_main_calls_document_their_errors(method):
    assert "Raises:" in inspect.getdoc(method)


def test_every_event_class_is_exported_and_documented():
    for name in events.__all__:
        cls = getattr(events, name)
        assert issubclass(cls, events.SessionEvent) and inspect.getdoc(cls), name


def test_enums_mirror_the_wire_codes():
    assert [t.value for t in bmq.PropertyType] == list(range(1, 8))
    assert bmq.CompressionAlgorithmType.ZLIB.value == 1 and bmq.CompressionAlgorithmType.NONE.value == 0
    assert bmq.AckStatus.SUCCESS.value == 0 and bmq.AckStatus.LIMIT_MESSAGES.value == -100
