"""bmq.compat: the official ``blazingmq`` package's API, running on bmq.

Code written for Bloomberg's ``blazingmq`` Python SDK runs on bmq unchanged once
:func:`install` has registered this package as ``blazingmq``::

    import bmq.compat
    bmq.compat.install()          # before anything imports blazingmq

    import blazingmq              # this package from now on
    with blazingmq.Session(blazingmq.session_events.log_session_event) as session:
        session.open_queue("bmq://bmq.test.mem.priority/q", write=True)
        session.post("bmq://bmq.test.mem.priority/q", b"hello", on_ack=print)

or by importing it under that name: ``import bmq.compat as blazingmq``. The names, signatures,
defaults, errors, events and callback rules are the official package's; where bmq behaves
better (a callback may call the session, a lost session is stopped rather than aborting the
process) it keeps bmq's behaviour: docs/compat.md lists every difference.
``pytest -p bmq.compat.pytest_plugin`` runs a test suite written for ``blazingmq`` on bmq.

Thread-safety: see :class:`Session`.
"""
from __future__ import annotations

import sys
import types

from bmq import AckStatus, CompressionAlgorithmType, PropertyType

from . import exceptions, session_events, testing
from ._messages import Ack, Message, MessageHandle
from ._monitors import BasicHealthMonitor
from ._session import QueueOptions, Session, SessionOptions
from ._timeouts import Timeouts
from ._typing import PropertyTypeDict, PropertyValueDict
from .exceptions import Error

#: The official package's version whose API this layer provides.
__version__ = "1.2.3"

__all__ = [
    "Ack",
    "AckStatus",
    "BasicHealthMonitor",
    "CompressionAlgorithmType",
    "Error",
    "PropertyType",
    "PropertyTypeDict",
    "PropertyValueDict",
    "QueueOptions",
    "Message",
    "MessageHandle",
    "Session",
    "SessionOptions",
    "Timeouts",
    "__version__",
    "exceptions",
    "session_events",
]

_SUBMODULES = ("exceptions", "session_events", "testing", "_ext", "_messages", "_monitors", "_session",
               "_timeouts", "_typing")


def install(name: str = "blazingmq") -> types.ModuleType:
    """Register this package as ``name`` (and its submodules under it) in ``sys.modules``, so
    that ``import blazingmq`` and ``from blazingmq.session_events import ...`` get bmq.compat.

    Call it before anything imports the official package. Idempotent.

    Args:
        name: the module name to register (``"blazingmq"``).

    Returns:
        This package.

    Raises:
        RuntimeError: another module is already imported as ``name`` (for instance the official
            package itself): code holding it would keep using it, half the program on each.
    """
    package = sys.modules[__name__]
    present = sys.modules.get(name)
    if present is not None and present is not package:
        raise RuntimeError(f"{name!r} is already imported from {getattr(present, '__file__', present)!r}: "
                           f"call bmq.compat.install() before anything imports {name}")
    sys.modules[name] = package
    for sub in _SUBMODULES:
        sys.modules[f"{name}.{sub}"] = sys.modules[f"{__name__}.{sub}"]
    return package
