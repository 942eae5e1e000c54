"""The exceptions of :mod:`bmq.compat` (the official ``blazingmq.exceptions`` module's names).

Every failure the layer reports is an :class:`Error`; a request the broker did not answer in
time is a :class:`BrokerTimeoutError`. The bmq exception that caused one is its ``__cause__``.
"""
from __future__ import annotations

__all__ = ["Error", "BrokerTimeoutError"]


class Error(Exception):
    """Any failure reported by :mod:`bmq.compat` (``blazingmq.Error`` once installed)."""


class BrokerTimeoutError(Error):
    """The broker did not answer a request within its timeout."""
