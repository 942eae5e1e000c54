"""Queue URI parsing (protocol §13): ``bmq://domain[.~tier]/queue[?id=appId]``."""
from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple, Optional

from .exceptions import InvalidURIError

__all__ = ["QueueUri", "parse_uri"]

_SCHEME = "bmq://"
_MAX_QUEUE_NAME = 64
# One regex per grammar element so that the error can name the part that is wrong.
_DOMAIN = re.compile(r"[A-Za-z0-9_.\-]+\Z")
_TIER = re.compile(r"[A-Za-z0-9\-]+\Z")
_NAME = re.compile(r"[A-Za-z0-9_.\-]+\Z")


class QueueUri(NamedTuple):
    """A parsed queue URI.

    Attributes:
        uri: the full URI string as given (sent to the broker in ``handleParameters.uri``).
        canonical: the URI without its ``?id=`` query; handles are grouped by it.
        domain: the domain name, without tier.
        tier: the tier (after ``.~``), or None.
        queue: the queue name.
        app_id: the ``id`` of the query (fan-out appId), or None.
    """

    uri: str
    canonical: str
    domain: str
    tier: Optional[str]
    queue: str
    app_id: Optional[str]


@lru_cache(maxsize=1024)
def parse_uri(uri: str) -> QueueUri:
    """Parse and validate a queue URI.

    Args:
        uri: e.g. ``"bmq://bmq.test.mem.fanout/orders?id=foo"``.

    Returns:
        The parsed :class:`QueueUri`.

    Raises:
        InvalidURIError: the string does not follow the grammar; the message names the part.
    """
    if not isinstance(uri, str):
        raise InvalidURIError(f"queue URI must be a str, not {type(uri).__name__}")
    if not uri.startswith(_SCHEME):
        raise InvalidURIError(f"invalid scheme in {uri!r}: a queue URI starts with 'bmq://'")
    rest = uri[len(_SCHEME):]
    path, sep, query = rest.partition("?")
    authority, slash, queue = path.partition("/")
    if not authority:
        raise InvalidURIError(f"missing domain in {uri!r}")
    domain, tilde, tier = authority.partition(".~")
    if not domain:
        raise InvalidURIError(f"missing domain in {uri!r}")
    if not _DOMAIN.match(domain):
        raise InvalidURIError(f"unsupported character in the domain of {uri!r}")
    if tilde and not tier:
        raise InvalidURIError(f"empty tier in {uri!r}")
    if tilde and not _TIER.match(tier):
        raise InvalidURIError(f"unsupported character in the tier of {uri!r}")
    if not slash or not queue:
        raise InvalidURIError(f"missing queue name in {uri!r}")
    if not _NAME.match(queue):
        raise InvalidURIError(f"unsupported character in the queue name of {uri!r}")
    if len(queue) > _MAX_QUEUE_NAME:
        raise InvalidURIError(f"queue name longer than {_MAX_QUEUE_NAME} characters in {uri!r}")
    app_id: Optional[str] = None
    if sep:
        key, eq, value = query.partition("=")
        if key != "id" or not eq or not value or not _NAME.match(value):
            raise InvalidURIError(f"bad query in {uri!r}: the only form is '?id=<appId>'")
        app_id = value
    return QueueUri(uri, _SCHEME + path, domain, tier if tilde else None, queue, app_id)
