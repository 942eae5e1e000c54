"""Helpers shared by tests that drive sessions (importable: pytest puts tests/ on sys.path)."""
from __future__ import annotations

import contextlib
import dis
import itertools
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Collection, Dict, Iterator, List, Set, Type

import bmq
from bmq import _codec, events

_names = itertools.count()


def fresh_uri(domain: str = "bmq.test.mem.priority", prefix: str = "q") -> str:
    """A queue URI no other test uses, so tests sharing a broker cannot see each other's messages."""
    return f"bmq://{domain}/{prefix}{next(_names)}-{time.monotonic_ns() % 10**9}"


def until(predicate: Callable[[], object], timeout: float) -> bool:
    """Whether ``predicate()`` became true within ``timeout`` seconds, looked at every ms: for
    state another thread changes without signalling anything to wait on."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.001)
    return True


def drain(queue: bmq.Queue, count: int, timeout: float = 10.0) -> list:
    """Messages taken from ``queue`` until ``count`` arrived or ``timeout`` seconds passed."""
    received = []
    deadline = time.monotonic() + timeout
    while len(received) < count and time.monotonic() < deadline:
        message = queue.get(timeout=max(0.0, deadline - time.monotonic()))
        if message is not None:
            received.append(message)
    return received


# Reconnect at once (tests inject the failures and want the recovery quickly).
FAST_RECONNECT = bmq.ReconnectPolicy(initial_delay=0.01, max_delay=0.2, jitter=0.2)


def ha_options(**kwargs) -> bmq.SessionOptions:
    """SessionOptions with :data:`FAST_RECONNECT` unless ``reconnect`` is given."""
    kwargs.setdefault("reconnect", FAST_RECONNECT)
    return bmq.SessionOptions(**kwargs)


def wait_event(session: bmq.Session, kind: Type[events.SessionEvent], timeout: float = 10.0) -> List:
    """Events up to and including the first of ``kind``; AssertionError if none comes in time."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = session.next_event(max(0.0, deadline - time.monotonic()))
        if event is None:
            break
        seen.append(event)
        if isinstance(event, kind):
            return seen
    raise AssertionError(f"no {kind.__name__} within {timeout} s; saw {seen}")


def expand_columns(runs: list) -> list:
    """push_columns' runs back as one ``(queue_id, guid, sub_ids, area, new_style, payload)``
    per message (new_style only where there is an area, as a Message reads it)."""
    out = []
    for queue_id, sub_ids, count, guids, payloads, offsets, areas in runs:
        ends = memoryview(offsets).cast("i")
        assert len(ends) == count + 1 and ends[0] == 0 and ends[count] == len(payloads)
        for index in range(count):
            area, new_style = (areas or {}).get(index, (None, None))
            out.append((queue_id, guids[16 * index:16 * index + 16], sub_ids, area, new_style,
                        payloads[ends[index]:ends[index + 1]]))
    return out


def messages_of_push(event: bytes) -> list:
    """iter_push_messages' messages in expand_columns' shape."""
    return [(queue_id, guid, sub_ids, area, new_style if area is not None else None, payload)
            for queue_id, guid, sub_ids, _, area, new_style, payload in _codec.iter_push_messages(event)]


class Interrupted(Exception):
    """Raised by the handler :func:`sigusr1_raises` installs."""


@contextlib.contextmanager
def sigusr1_raises() -> Iterator[None]:
    """While inside, SIGUSR1 raises :class:`Interrupted` in the main thread (as Ctrl-C would
    raise KeyboardInterrupt, without disturbing pytest's own handling of that)."""
    def handler(signum, frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def sigint_at_default() -> None:
    """``preexec_fn`` of a child that must take Ctrl-C (SIGINT) as at a terminal. A shell
    without job control starts its background jobs with SIGINT ignored (CI's pieces are started
    with it at its default again, ``.ci/lib.sh``; a user's ``pytest ... &`` in a script is not),
    and a child inherits that: it would not see the signal the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# What CPython does before a signal handler runs (and so where its exception can come from):
# it looks for pending signals as a function starts, after a loop's jump back (at the jump's
# target), and after a call returns, before the next instruction (3.10-3.14); never between
# two instructions of straight-line code without a call.
_CALLS = {"CALL", "CALL_KW", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_FUNCTION_EX", "CALL_METHOD"}


class _Points:
    """Where in one code object a signal handler can run: ``at`` (offsets of the instructions
    before which it can, whatever came before: a function's start, after a call) and ``jumps``
    (a backward jump's offset: its target, a point when reached by that jump); ``lines`` maps
    offsets to line numbers."""

    _cache: Dict[Any, "_Points"] = {}

    def __init__(self, code: Any) -> None:
        instructions = list(dis.get_instructions(code))
        self.lines: Dict[int, int] = {}
        line = code.co_firstlineno
        for instruction in instructions:
            line = instruction.starts_line if isinstance(instruction.starts_line, int) else line
            self.lines[instruction.offset] = line = getattr(instruction, "line_number", None) or line
        # 3.11+: which handler an offset's exception goes to. CPython handles an exception met
        # after a call as one in the call, and after a jump back as one in the target or the
        # instruction before it (by version): a point is kept only where these agree with the
        # instruction the exception is raised at here (not, say, the first instruction of a
        # finally block's copy for the normal way out, right after the try block's last call).
        entries = getattr(dis.Bytecode(code), "exception_entries", [])

        def handler(offset: int) -> Any:
            return next((entry.target for entry in entries if entry.start <= offset < entry.end), None)

        self.at = {0}
        self.jumps: Dict[int, int] = {}
        before: Dict[int, int] = {}
        previous = None
        for instruction in instructions:
            if previous is not None:
                before[instruction.offset] = previous.offset
                if previous.opname in _CALLS and handler(previous.offset) == handler(instruction.offset):
                    self.at.add(instruction.offset)
            if instruction.opname == "RESUME":
                self.at.add(instruction.offset)
            previous = instruction
        for instruction in instructions:
            target = instruction.argval
            if (instruction.opname in ("JUMP_BACKWARD", "JUMP_ABSOLUTE") and target <= instruction.offset
                    and handler(target) == handler(before.get(target, target))):
                self.jumps[instruction.offset] = target

    @classmethod
    def of(cls, code: Any) -> "_Points":
        points = cls._cache.get(code)
        if points is None:
            points = cls._cache[code] = cls(code)
        return points


class _Interrupt:
    """Where a KeyboardInterrupt is to be raised: at the ``at``-th point (see :class:`_Points`)
    run by this thread."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.seen = 0
        self.fired = False
        self.thread = threading.get_ident()
        self.last: Any = None  # (code, offset) of the instruction run before

    def reached(self, code: Any, offset: int) -> None:
        """Called before the instruction at ``offset`` of ``code`` runs: raise there if due."""
        if self.fired or threading.get_ident() != self.thread:
            return
        points = _Points.of(code)
        last, self.last = self.last, (code, offset)
        if offset in points.at or (last is not None and last[0] is code and points.jumps.get(last[1]) == offset):
            self.seen += 1
            if self.seen > self.at:
                self.fired = True
                raise KeyboardInterrupt(f"at {code.co_name}:{points.lines.get(offset)} (offset {offset})")


def _codes_named(functions: Collection[str]) -> Set[Any]:
    """The code objects of bmq's functions and methods named in ``functions``."""
    codes = set()
    for name, module in list(sys.modules.items()):
        if name != "bmq" and not name.startswith("bmq."):
            continue
        for value in list(vars(module).values()):
            for item in list(vars(value).values()) if isinstance(value, type) else [value]:
                item = getattr(item, "__func__", None) or getattr(item, "fget", None) or item
                code = getattr(item, "__code__", None)
                if code is not None and code.co_name in functions and code.co_filename.startswith(
                        os.path.dirname(bmq.__file__)):
                    codes.add(code)
    return codes


_TOOL = 4  # a sys.monitoring tool id that no debugger, coverage tool or profiler claims


def interrupted_at(action: Callable[[], object], at: int, functions: Collection[str]) -> str:
    """Run ``action`` with a KeyboardInterrupt raised at the ``at``-th point in ``functions``
    (names of bmq's functions and methods, run by this thread) where a signal handler could
    raise it; where it did ("function:line (offset)", having reached the caller), or "" if
    ``action`` ran to its end first. Trying ``at`` = 0, 1, 2... until it returns "" interrupts
    ``action`` at every such point in turn.

    On 3.12+ through ``sys.monitoring`` (there a trace function's exception at a loop's jump
    back is lost, and a function's first call once traced reports no instructions), on
    3.10-3.11 through a trace function's per-instruction events."""
    interrupt = _Interrupt(at)
    monitoring = getattr(sys, "monitoring", None)
    try:
        if monitoring is not None:
            codes = _codes_named(functions)
            monitoring.use_tool_id(_TOOL, "bmq tests: interrupts")
            monitoring.register_callback(_TOOL, monitoring.events.INSTRUCTION, interrupt.reached)
            for code in codes:
                monitoring.set_local_events(_TOOL, code, monitoring.events.INSTRUCTION)
            try:
                action()
            finally:
                for code in codes:
                    monitoring.set_local_events(_TOOL, code, 0)
                monitoring.register_callback(_TOOL, monitoring.events.INSTRUCTION, None)
                monitoring.free_tool_id(_TOOL)
        else:
            def trace(frame: Any, event: str, arg: Any) -> Any:
                if event == "call":
                    module = frame.f_globals.get("__name__", "")
                    if not (module.startswith("bmq.") and frame.f_code.co_name in functions):
                        return None
                    frame.f_trace_lines = False
                    frame.f_trace_opcodes = True
                elif event == "opcode":
                    interrupt.reached(frame.f_code, frame.f_lasti)
                return trace

            sys.settrace(trace)
            try:
                action()
            finally:
                sys.settrace(None)
    except KeyboardInterrupt as e:
        assert interrupt.fired
        return str(e)
    return ""
