"""Testing helpers, as the official ``blazingmq.testing`` module: ``HostHealth`` is another name
of :class:`bmq.compat.BasicHealthMonitor`, kept for code written against older SDK versions."""
from __future__ import annotations

from ._monitors import BasicHealthMonitor

__all__ = ["HostHealth"]

HostHealth = BasicHealthMonitor
"""The older name of :class:`bmq.compat.BasicHealthMonitor` (the same class)."""
