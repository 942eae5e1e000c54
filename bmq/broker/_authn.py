"""Authentication in the embedded broker, as bmqbrkr's built-in authenticators behave.

Observed with bmqbrkr (``appConfig.authentication`` with a BasicAuthenticator and
``anonymousCredential: disallow``), and reproduced here with its categories, codes and texts:

* An AuthenticationRequest may come before the ClientIdentity, and again on the live
  connection (re-authentication). Mechanisms are case-insensitive.
* BASIC ``user:password`` that matches: ``E_SUCCESS``, ``lifetimeMs`` 600,000. Not matching:
  ``E_REFUSED`` -11 naming the user (never the password), then the connection is closed.
* A mechanism without an authenticator: ``E_REFUSED`` -2, then the connection is closed.
* Negotiating without authenticating when anonymous clients are disallowed: the connection is
  closed without an answer.
* A credential that is not renewed within its lifetime: the connection is closed.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

__all__ = ["Authenticators", "Verdict"]

#: ``(category, code, message, lifetime in ms or None)`` of an AuthenticationResponse.
Verdict = Tuple[str, int, str, Optional[int]]

BASIC_LIFETIME_MS = 600_000  # bmqbrkr's BasicAuthenticator
_SUPPORTED = ("BASIC", "ANONYMOUS")


class Authenticators:
    """Which credentials the embedded broker accepts.

    Args:
        authenticators: mechanism -> its settings; ``{"BASIC": {"user": "password", ...}}``.
            ``ANONYMOUS`` needs no settings and is accepted when anonymous clients are allowed.
        allow_anonymous: whether a client may negotiate without authenticating (bmqbrkr's
            default; ``anonymousCredential: disallow`` turns it off).
        lifetime_ms: the lifetime given to a BASIC credential (bmqbrkr: 600,000).

    Thread-safety: immutable after construction.
    """

    def __init__(self, authenticators: Optional[Mapping[str, Mapping[str, str]]] = None, *,
                 allow_anonymous: bool = True, lifetime_ms: int = BASIC_LIFETIME_MS) -> None:
        self._settings: Dict[str, Dict[str, str]] = {}
        for mechanism, settings in (authenticators or {}).items():
            if mechanism.upper() not in _SUPPORTED:
                raise ValueError(f"unsupported authenticator {mechanism!r}: the embedded broker has "
                                 f"{', '.join(_SUPPORTED)}")
            self._settings[mechanism.upper()] = dict(settings)
        self.allow_anonymous = allow_anonymous
        self.lifetime_ms = lifetime_ms

    def check(self, mechanism: str, data: bytes) -> Verdict:
        """The broker's answer to an AuthenticationRequest."""
        mechanism = mechanism.upper()
        if mechanism == "ANONYMOUS" and self.allow_anonymous:
            return "E_SUCCESS", 0, "", None
        if mechanism not in self._settings or mechanism == "ANONYMOUS":
            return "E_REFUSED", -2, f"Authentication mechanism '{mechanism}' not supported.", None
        user, _, password = data.decode("utf-8", "replace").partition(":")
        if self._settings[mechanism].get(user) == password:
            return "E_SUCCESS", 0, "", self.lifetime_ms
        return ("E_REFUSED", -11, f"Failed to authenticate with mechanism '{mechanism}'. (rc = -1). Detailed "
                f"error: Invalid username or password for user '{user}'", None)
