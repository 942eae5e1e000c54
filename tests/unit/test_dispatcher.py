"""The dispatcher thread (bmq._dispatch.Dispatcher): callbacks in submission order, and its
backlog's watermark notices alternating (slow, normal, slow, ...) however many threads submit."""
from __future__ import annotations

import threading
from typing import List

from bmq._dispatch import Dispatcher


def test_callbacks_run_in_submission_order():
    ran: List[int] = []
    done = threading.Event()
    dispatcher = Dispatcher("test-dispatcher", high=100, low=10, on_slow=lambda slow: None)
    dispatcher.start()
    for i in range(500):
        dispatcher.submit(ran.append, i)
    dispatcher.submit(done.set)
    assert done.wait(30)
    dispatcher.stop()
    dispatcher.thread.join(30)
    assert ran == list(range(500))


def test_watermark_notices_alternate_with_many_submitting_threads():
    # Submitters and the dispatcher thread turn the slow flag over at once: checking it and
    # setting it were two steps, so two submitters could both tell "slow" (and a "normal" could
    # come between). Found by reading (issue 41's audit): this run did not catch the old code
    # in 3 tries on 3.13t with the GIL off, the window being one crossing per cycle; it guards
    # the alternation all the same.
    notices: List[bool] = []
    gate = threading.Event()  # holds the dispatcher so that the backlog crosses the high mark
    dispatcher = Dispatcher("test-dispatcher", high=20, low=5, on_slow=notices.append)
    dispatcher.start()
    start = threading.Barrier(8)

    def submit_many() -> None:
        start.wait(timeout=30)
        for i in range(3000):
            dispatcher.submit(gate.wait, 30) if i == 0 else dispatcher.submit(int)

    threads = [threading.Thread(target=submit_many) for _ in range(8)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    drained = threading.Event()
    dispatcher.submit(drained.set)
    assert drained.wait(60)
    dispatcher.stop()
    dispatcher.thread.join(30)
    assert notices, "the backlog never crossed the high watermark"
    assert notices == [i % 2 == 0 for i in range(len(notices))], notices  # True, False, True...
    assert notices[-1] is False  # drained: normal again
