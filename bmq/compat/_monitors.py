"""``BasicHealthMonitor``: the application (or a test) says whether the host is healthy."""
from __future__ import annotations

from bmq import ManualHostHealthMonitor

__all__ = ["BasicHealthMonitor"]


class BasicHealthMonitor:
    """A host health switch for a :class:`bmq.compat.Session` (``host_health_monitor=``).

    A new monitor says healthy. :meth:`set_unhealthy` makes the sessions using it emit
    ``HostUnhealthy`` and suspend the queues opened with ``suspends_on_bad_host_health=True``
    (``QueueSuspended`` for each); :meth:`set_healthy` resumes them (``QueueResumed`` each),
    then emits ``HostHealthRestored``. It drives a :class:`bmq.ManualHostHealthMonitor`.

    Thread-safety: any thread; the sessions do the work on their own threads.
    """

    def __init__(self) -> None:
        self._monitor = ManualHostHealthMonitor()

    def set_healthy(self) -> None:
        """Report the host healthy (nothing happens if it already is)."""
        self._monitor.set_healthy()

    def set_unhealthy(self) -> None:
        """Report the host unhealthy (nothing happens if it already is)."""
        self._monitor.set_unhealthy()

    def __repr__(self) -> str:
        return "BasicHealthMonitor()"
