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


# ---- the futures returned by post_many_async ----------------------------------------------
@pytest.mark.parametrize("made_by", ["one post_many_async", "three post_async in one thread"])
def test_post_futures_behave_like_standard_futures(made_by):
    """Futures share a condition (a batch's, or a thread's for single posts): each still
    behaves as its own standard Future."""
    import concurrent.futures as cf
    import threading

    from bmq._dispatch import new_futures, resolve_future

    if made_by == "one post_many_async":
        first, second, third = new_futures(3)
    else:
        (first,), (second,), (third,) = new_futures(1), new_futures(1), new_futures(1)
    assert all(isinstance(f, cf.Future) for f in (first, second, third))
    # A sibling resolving must not wake result() early with a TimeoutError.
    waited = {}

    def wait_second():
        waited["value"] = second.result(5.0)

    waiter = threading.Thread(target=wait_second)
    waiter.start()
    first.set_result("a")
    with pytest.raises(cf.TimeoutError):
        third.result(0.05)
    second.set_result("b")
    waiter.join(5.0)
    assert waited == {"value": "b"}
    called = []
    third.add_done_callback(lambda f: called.append(f.result()))
    done, not_done = cf.wait([first, second, third], timeout=0.05)
    assert done == {first, second} and not_done == {third}
    third.set_result("c")
    assert called == ["c"]
    assert sorted(f.result() for f in cf.as_completed([first, second, third], timeout=1.0)) == ["a", "b", "c"]
    # Born running: an accepted post cannot be cancelled, so wait() always sees it settle.
    for uncancellable in (*new_futures(1), *new_futures(2)):
        assert uncancellable.running() and not uncancellable.cancel() and not uncancellable.cancelled()
        resolve_future(uncancellable, "ack")
        assert cf.wait([uncancellable], timeout=1.0).done == {uncancellable}
    (errored,) = new_futures(1)
    errored.set_exception(ValueError("x"))
    assert isinstance(errored.exception(1.0), ValueError)
    with pytest.raises(ValueError):
        errored.result(0)


def test_futures_resolved_together_behave_like_set_result_on_each():
    """resolve_futures (how an ACK event settles its futures) takes each shared condition once:
    waiters, concurrent.futures.wait and done-callbacks must all see what set_result gives."""
    import concurrent.futures as cf
    import threading

    from bmq._dispatch import new_futures, resolve_futures

    batch = new_futures(2)
    single_a, single_b = new_futures(1)[0], new_futures(1)[0]  # one thread's: a shared condition
    already = new_futures(1)[0]
    already.set_result("first answer")
    futures = [single_a, batch[0], batch[1], single_b, already]
    woke = {}
    waiter = threading.Thread(target=lambda: woke.setdefault("value", batch[1].result(5.0)))
    waiter.start()
    called = []
    single_b.add_done_callback(lambda f: called.append(f.result()))
    with cf.ThreadPoolExecutor(1) as pool:
        waiting_on = pool.submit(cf.wait, [single_a, batch[0]], 5.0)
        resolve_futures(futures, ["a", "b0", "b1", "b", "late"])
        assert waiting_on.result(5.0).done == {single_a, batch[0]}
    waiter.join(5.0)
    assert woke == {"value": "b1"}
    assert [f.result(0) for f in futures] == ["a", "b0", "b1", "b", "first answer"]
    assert called == ["b"]
