"""Host health monitors: tell a session when to suspend queues opened with
``QueueOptions(suspends_on_bad_host_health=True)`` (protocol §11.6)."""
from __future__ import annotations

import logging
import threading
from typing import Callable, List

__all__ = ["HostHealthMonitor", "ManualHostHealthMonitor"]

logger = logging.getLogger(__name__)

Listener = Callable[[bool], None]


class HostHealthMonitor:
    """Base class: holds the current health and notifies listeners when it changes.

    Subclasses (or any code) call :meth:`_set_health`; sessions subscribe with
    :meth:`add_listener`. A listener runs on the thread that changed the health and must
    not block (sessions hand the work to their own threads).

    Thread-safety: thread-safe.
    """

    def __init__(self, healthy: bool = True) -> None:
        self._lock = threading.Lock()
        self._healthy = healthy
        self._listeners: List[Listener] = []

    @property
    def healthy(self) -> bool:
        """True when the host is healthy."""
        return self._healthy

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(healthy)`` on every change from now on."""
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Stop notifying ``listener`` (no error when it was not added)."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _set_health(self, healthy: bool) -> None:
        with self._lock:
            if healthy == self._healthy:
                return
            self._healthy = healthy
            listeners = list(self._listeners)
        logger.warning("host health changed: %s", "healthy" if healthy else "unhealthy")
        for listener in listeners:
            listener(healthy)


class ManualHostHealthMonitor(HostHealthMonitor):
    """A monitor switched by the application (like the official SDK's BasicHealthMonitor).

    Thread-safety: thread-safe.
    """

    def set_healthy(self) -> None:
        """Report the host healthy: suspended queues resume."""
        self._set_health(True)

    def set_unhealthy(self) -> None:
        """Report the host unhealthy: opted-in queues are suspended."""
        self._set_health(False)
