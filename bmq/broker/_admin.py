"""The embedded broker's admin commands: what an admin client (ClientIdentity ``E_TCPADMIN``)
may ask in ``adminCommand {command}``, answered in ``adminCommandResponse {text}``.

It answers the subset that :class:`bmq.Admin`'s helpers for a single broker use, in the JSON
shapes they parse from bmqbrkr, so that the helpers work the same on both:

* ``HELP``
* ``DOMAINS DOMAIN <name> INFOS`` and ``DOMAINS DOMAIN <name> PURGE``
* ``DOMAINS DOMAIN <name> QUEUE <queue> INTERNALS`` and ``... QUEUE <queue> PURGE <appId|*>``
* ``STAT SHOW`` (current values of the queues, not per-interval deltas)

each optionally after ``ENCODING TEXT|JSON_COMPACT|JSON_PRETTY``. Differences from bmqbrkr:
every answer is JSON, whatever the encoding asked (``TEXT`` gets pretty JSON); an error is
``{"error": {"message": ...}}`` also in text (bmqbrkr answers a bare sentence there); every
configured domain is known (bmqbrkr knows a domain once a queue of it was opened); cluster
commands and the rest are refused with an error naming what is supported, since the embedded
broker is no cluster member.

Thread-safety: :func:`execute` runs under the broker's state lock (it reads and purges queues).
"""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

from .._protocol import DEFAULT_APP_ID

if TYPE_CHECKING:  # pragma: no cover
    from ._connection import ClientSession
    from ._queues import Domain, Queue

__all__ = ["execute", "SUPPORTED"]

SUPPORTED: Tuple[Tuple[str, str], ...] = (
    ("HELP", "list the admin commands this broker answers"),
    ("DOMAINS DOMAIN <name> INFOS", "the domain's configuration, queues and content"),
    ("DOMAINS DOMAIN <name> PURGE", "drop every message of every queue of the domain"),
    ("DOMAINS DOMAIN <name> QUEUE <queue> INTERNALS", "what the broker holds for the queue, per appId"),
    ("DOMAINS DOMAIN <name> QUEUE <queue> PURGE <appId>",
     "drop every message held for the appId of the queue ('*': every appId)"),
    ("STAT SHOW", "statistics of every domain and queue"),
)
_ENCODINGS = ("TEXT", "JSON_COMPACT", "JSON_PRETTY")


class _Refused(Exception):
    """A command this broker will not execute; the text is the error message."""


def execute(command: str, domains: Dict[str, "Domain"], queues: Dict[str, "Queue"],
            sessions: Iterable["ClientSession"]) -> str:
    """The answer to one admin command.

    Args:
        command: the command as the admin client sent it.
        domains: the broker's configured domains.
        queues: canonical URI -> queue, every queue ever opened.
        sessions: the connected clients (for producer and consumer counts).

    Returns:
        The ``adminCommandResponse`` text (JSON; see the module's docstring).
    """
    words = command.split()
    encoding = "TEXT"
    if words and words[0].upper() == "ENCODING":
        if len(words) < 2 or words[1].upper() not in _ENCODINGS:
            return _render({"error": {"message": f"ENCODING must be followed by one of {', '.join(_ENCODINGS)}"}},
                           "TEXT")
        encoding = words[1].upper()
        words = words[2:]
    try:
        result = _dispatch(words, " ".join(words), domains, queues, list(sessions))
    except _Refused as exc:
        result = {"error": {"message": str(exc)}}
    return _render(result, encoding)


def _render(result: Dict[str, Any], encoding: str) -> str:
    if encoding == "JSON_COMPACT":
        return json.dumps(result, separators=(",", ":"))
    return json.dumps(result, indent=4) + "\n"


def _dispatch(words: List[str], command: str, domains: Dict[str, "Domain"], queues: Dict[str, "Queue"],
              sessions: List["ClientSession"]) -> Dict[str, Any]:
    upper = [w.upper() for w in words]
    if upper == ["HELP"]:
        return {"help": {"commands": [{"command": c, "description": d} for c, d in SUPPORTED]}}
    if upper == ["STAT", "SHOW"]:
        return {"stats": json.dumps(_stats(queues, sessions))}
    if len(words) >= 4 and upper[:2] == ["DOMAINS", "DOMAIN"]:
        name = words[2]
        domain = domains.get(name)
        if domain is None:
            raise _Refused(f"the domain '{name}' is not configured on this broker")
        in_domain = sorted((q for q in queues.values() if q.domain_name == name), key=lambda q: q.uri)
        if upper[3:] == ["INFOS"]:
            return {"domainInfo": _domain_info(name, domain, in_domain)}
        if upper[3:] == ["PURGE"]:
            return {"purgedQueues": {"queues": [_purge(q, None) for q in in_domain]}}
        if len(words) >= 6 and upper[3] == "QUEUE":
            uri = f"bmq://{name}/{words[4]}"
            queue = queues.get(uri)
            if queue is None:
                raise _Refused(f"no queue '{words[4]}' in the domain '{name}' (never opened on this broker)")
            if upper[5:] == ["INTERNALS"]:
                return {"queueInternals": _internals(queue, sessions)}
            if upper[5] == "PURGE" and len(words) == 7:
                app_id = None if words[6] == "*" else words[6]
                return {"purgedQueues": {"queues": [_purge(queue, app_id)]}}
    supported = "; ".join(c for c, _ in SUPPORTED)
    raise _Refused(f"the embedded broker (bmq.broker) does not support the admin command {command!r}; "
                   f"it answers: {supported}")


def _storage_entry(queue: "Queue") -> Dict[str, Any]:
    return {"queueUri": queue.uri, "queueKey": "", "partitionId": 0, "numMessages": queue.held,
            "numBytes": queue.bytes, "isPersistent": False, "internalQueueId": 0}


def _domain_info(name: str, domain: "Domain", queues: List["Queue"]) -> Dict[str, Any]:
    config = {"mode": domain.mode, "appIds": list(domain.app_ids), "maxMessages": domain.max_messages,
              "maxBytes": domain.max_bytes, "deduplicationTimeMs": domain.deduplication_time_ms}
    return {
        "name": name,
        "configJson": json.dumps(config, indent=2),
        "clusterName": "",
        "capacityMeter": {"name": f"domain [bmq://{name}]", "isDisabled": False,
                          "numMessages": sum(q.held for q in queues), "numBytes": sum(q.bytes for q in queues)},
        "queueUris": [q.uri for q in queues],
        "storageContent": {"storages": [_storage_entry(q) for q in queues]},
    }


def _consumers(queue: "Queue", app_id: str) -> int:
    """Reader streams with at least one consumer (a configured, not deconfigured, reader)."""
    app = queue.app(app_id)
    return 0 if app is None else len({id(c.stream) for c in app.consumers})


def _producers(queue: "Queue", sessions: List["ClientSession"]) -> int:
    return sum(1 for s in sessions for h in s.handles.values() if h.queue is queue and h.write_count > 0)


def _internals(queue: "Queue", sessions: List["ClientSession"]) -> Dict[str, Any]:
    fanout = queue.domain.mode == "fanout"
    storage: Dict[str, Any] = {"numMessages": queue.held, "numBytes": queue.bytes}
    if fanout:
        storage["virtualStorages"] = [{"appId": app_id, "appKey": "", "numMessages": app.held()}
                                      for app_id, app in queue.apps.items()]
    states = [{"appId": app_id, "status": "registered",
               "appState": {"appId": app_id, "numConsumers": _consumers(queue, app_id),
                            "redeliveryListLength": len(app.redelivery)}}
              for app_id, app in queue.apps.items()]
    return {
        "state": {"uri": queue.uri, "partitionId": 0, "storage": storage,
                  "numProducers": _producers(queue, sessions)},
        "queue": {"localQueue": {"queueEngine": {queue.domain.mode: {"mode": queue.domain.mode,
                                                                     "consumerStates": states}}}},
    }


def _purge(queue: "Queue", app_id: Optional[str]) -> Dict[str, Any]:
    try:
        messages, size = queue.purge(app_id)
    except KeyError:
        return {"error": {"message": f"the queue '{queue.uri}' has no appId '{app_id}'"}}
    return {"queue": {"queueUri": queue.uri, "appId": app_id or "", "appKey": "",
                      "numMessagesPurged": messages, "numBytesPurged": size}}


def _values(queue: "Queue", app_id: Optional[str], sessions: List["ClientSession"]) -> Dict[str, int]:
    if app_id is None:
        messages, size = queue.held, queue.bytes
        consumers = sum(_consumers(queue, a) for a in queue.apps)
        producers = _producers(queue, sessions)
    else:
        app = queue.apps[app_id]
        messages, size = app.held(), sum(len(m[1]) for m in queue.held_messages(app_id))
        consumers, producers = _consumers(queue, app_id), 0
    return {"queue_content_msgs": messages, "queue_content_bytes": size, "queue_msgs_current": messages,
            "queue_bytes_current": size, "queue_consumers_count": consumers, "queue_producers_count": producers,
            "queue_cfg_msgs": queue.domain.max_messages, "queue_cfg_bytes": queue.domain.max_bytes}


def _stats(queues: Dict[str, "Queue"], sessions: List["ClientSession"]) -> Dict[str, Any]:
    domains: Dict[str, Dict[str, Any]] = {}
    for queue in sorted(queues.values(), key=lambda q: q.uri):
        entry: Dict[str, Any] = {"values": _values(queue, None, sessions)}
        if queue.domain.mode == "fanout":
            entry["appIds"] = {a: {"values": _values(queue, a, sessions)} for a in queue.apps if a != DEFAULT_APP_ID}
        domains.setdefault(queue.domain_name, {})[queue.uri] = entry
    stamp = time.strftime("%d%b%Y_%H:%M:%S", time.gmtime()).upper() + ".000000"
    return {"_timestamp": stamp, "domainQueues": {"domains": domains}}
