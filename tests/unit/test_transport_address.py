"""parse_broker_address: only ``tcp://HOST:PORT`` (or ``HOST:PORT``) with an ASCII port in 1..65535."""
from __future__ import annotations

import pytest

from bmq._transport import parse_broker_address
from bmq.exceptions import InvalidURIError


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
    "tcp://127.0.0.1",
    "tcp://host/path:30114",
])
def test_bad_addresses_name_the_expected_form(address):
    with pytest.raises(InvalidURIError, match="tcp://HOST:PORT"):
        parse_broker_address(address)
