"""Queue URI grammar (protocol §13)."""
import pytest

from bmq import InvalidURIError
from bmq._uri import parse_uri


@pytest.mark.parametrize(
    "uri, domain, tier, queue, app_id",
    [
        ("bmq://bmq.test.mem.priority/orders", "bmq.test.mem.priority", None, "orders", None),
        ("bmq://ts.trades.myapp.~bt/my.queue", "ts.trades.myapp", "bt", "my.queue", None),
        ("bmq://bmq.test.mem.fanout/q-1_x?id=foo", "bmq.test.mem.fanout", None, "q-1_x", "foo"),
        ("bmq://d.~t-1/q?id=a.b-c_d", "d", "t-1", "q", "a.b-c_d"),
        ("bmq://d/" + "q" * 64, "d", None, "q" * 64, None),
    ],
)
def test_valid_uris_parse_into_parts(uri, domain, tier, queue, app_id):
    parsed = parse_uri(uri)
    assert (parsed.domain, parsed.tier, parsed.queue, parsed.app_id) == (domain, tier, queue, app_id)
    assert parsed.uri == uri
    assert parsed.canonical == uri.split("?")[0]


@pytest.mark.parametrize(
    "uri, fragment",
    [
        ("http://d/q", "scheme"),
        ("BMQ://d/q", "scheme"),
        ("bmq:///q", "domain"),
        ("bmq://.~t/q", "domain"),
        ("bmq://d.~/q", "tier"),
        ("bmq://d.~t_x/q", "tier"),
        ("bmq://d", "queue"),
        ("bmq://d/", "queue"),
        ("bmq://d/q~x", "queue name"),
        ("bmq://d/" + "q" * 65, "longer"),
        ("bmq://d/q?id=", "query"),
        ("bmq://d/q?app=foo", "query"),
        ("bmq://d/q?id=a&id=b", "query"),
        ("bmq://d o/q", "domain"),
    ],
)
def test_invalid_uris_name_the_bad_part(uri, fragment):
    with pytest.raises(InvalidURIError, match=fragment):
        parse_uri(uri)


def test_invalid_uri_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse_uri("nope")


def test_non_string_uri_is_rejected():
    with pytest.raises(InvalidURIError, match="str"):
        parse_uri(b"bmq://d/q")  # type: ignore[arg-type]
