"""Broker addresses: parse_broker_address takes only ``tcp://HOST:PORT`` (or ``HOST:PORT``) with an
ASCII port in 1..65535; BrokerAddresses is the ordered list a session fails over between."""
from __future__ import annotations

import socket

import pytest

from bmq._connection import BrokerAddresses
from bmq._transport import parse_broker_address
from bmq.exceptions import InvalidArgumentError, InvalidURIError


@pytest.mark.parametrize("address, expected", [
    ("tcp://127.0.0.1:30114", ("127.0.0.1", 30114)),
    ("localhost:1", ("localhost", 1)),
    ("tcp://[::1]:65535", ("::1", 65535)),
])
def test_good_addresses(address, expected):
    assert parse_broker_address(address) == expected


@pytest.mark.parametrize("address", [
    "http://127.0.0.1:30114",
    "udp://127.0.0.1:30114",
    "tcp://127.0.0.1:\u0663",  # ARABIC-INDIC DIGIT THREE: int() would take it as 3
    "tcp://127.0.0.1:\uff13\uff10",  # full-width digits
    "tcp://127.0.0.1:0",
    "tcp://127.0.0.1:65536",
    "tcp://127.0.0.1:",
    "tcp://:30114",
    "[:314",  # found by fuzzing: the host "[" was not empty until its bracket was stripped
    "tcp://[]:30114",
    "tcp://[::1:30114",
    "tcp://::1]:30114",
    "tcp://[::1]]:30114",
    "tcp://127.0.0.1",
    "tcp://host/path:30114",
])
def test_bad_addresses_name_the_expected_form(address):
    with pytest.raises(InvalidURIError, match="tcp://HOST:PORT"):
        parse_broker_address(address)


# ---- BrokerAddresses: the list a session fails over between --------------------------------


def _addresses(endpoints):
    return [endpoint.address for endpoint in endpoints]


def test_one_address_is_one_endpoint_named_as_given():
    brokers = BrokerAddresses("tcp://localhost:30114")
    assert len(brokers) == 1 and brokers.configured == ("tcp://localhost:30114",)
    assert brokers.first.address == "tcp://localhost:30114"


def test_rotation_starts_after_the_lost_address_and_ends_with_it():
    brokers = BrokerAddresses(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "127.0.0.1:3"])
    a, b, c = brokers.endpoints()
    assert _addresses(brokers.rotation()) == ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3"]
    assert brokers.rotation(a) == [b, c, a]
    assert brokers.rotation(b) == [c, a, b]
    assert brokers.rotation(c) == [a, b, c]
    assert c.configured == "127.0.0.1:3"


def test_a_name_resolving_to_several_addresses_is_each_of_them(monkeypatch):
    def getaddrinfo(host, port, *args, **kwargs):
        assert host == "brokers.example"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in ("10.0.0.1", "10.0.0.2", "10.0.0.1")] \
            + [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::3", port, 0, 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    brokers = BrokerAddresses(["tcp://brokers.example:30114", "tcp://127.0.0.1:2"])
    endpoints = brokers.endpoints()
    assert _addresses(endpoints) == ["tcp://10.0.0.1:30114", "tcp://10.0.0.2:30114", "tcp://[fd00::3]:30114",
                                     "tcp://127.0.0.1:2"]
    assert {e.configured for e in endpoints[:3]} == {"tcp://brokers.example:30114"}
    assert endpoints[2].host == "fd00::3"
    assert _addresses(brokers.rotation(endpoints[1]))[0] == "tcp://[fd00::3]:30114"


def test_a_name_that_does_not_resolve_stays_for_the_connect_to_report(monkeypatch):
    def getaddrinfo(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    assert _addresses(BrokerAddresses("tcp://nowhere.invalid:1").endpoints()) == ["tcp://nowhere.invalid:1"]


@pytest.mark.parametrize("brokers, error", [
    ([], InvalidArgumentError),
    ((), InvalidArgumentError),
    (["tcp://127.0.0.1:1", None], InvalidArgumentError),
    (["tcp://127.0.0.1:1", "tcp://127.0.0.1:0"], InvalidURIError),
])
def test_bad_lists(brokers, error):
    with pytest.raises(error):
        BrokerAddresses(brokers)
