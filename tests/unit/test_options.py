"""SessionOptions / QueueOptions / ReconnectPolicy: keyword-only, frozen, validated."""
import dataclasses
import random
import sys

import pytest

import bmq
from bmq import CompressionAlgorithmType, QueueOptions, ReconnectPolicy, SessionOptions


def test_defaults_match_the_documented_values():
    options = SessionOptions()
    assert options.channel_write_timeout == 5.0
    assert options.compression is CompressionAlgorithmType.NONE
    assert options.reconnect.enabled
    queue = QueueOptions()
    assert (queue.max_unconfirmed_messages, queue.max_unconfirmed_bytes, queue.consumer_priority) == (
        1000,
        32 * 1024 * 1024,
        0,
    )


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SessionOptions().ack_timeout = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        QueueOptions().consumer_priority = 3  # type: ignore[misc]


@pytest.mark.skipif(sys.version_info < (3, 10), reason="kw_only dataclasses need 3.10")
def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        QueueOptions(5)  # type: ignore[misc]


@pytest.mark.parametrize("value, expected", [("zlib", "ZLIB"), ("NONE", "NONE"), (None, "NONE")])
def test_compression_accepts_names(value, expected):
    assert SessionOptions(compression=value).compression is CompressionAlgorithmType[expected]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"connect_timeout": 0},
        {"ack_timeout": -1},
        {"channel_write_timeout": -0.1},
        {"compression": "lz4"},
        {"event_queue_low_watermark": 10, "event_queue_high_watermark": 5},
        {"on_event": 3},
        {"busy_poll": -0.001},
        {"busy_poll": 1},
        {"busy_poll": "0.0002"},
        {"busy_poll": True},
    ],
)
def test_bad_session_options_are_refused(kwargs):
    with pytest.raises(ValueError):
        SessionOptions(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_unconfirmed_messages": -1},
        {"max_unconfirmed_bytes": 1.5},
        {"consumer_priority": 2**30},
        {"subscriptions": ("",)},
    ],
)
def test_bad_queue_options_are_refused(kwargs):
    with pytest.raises(ValueError):
        QueueOptions(**kwargs)


def test_a_single_subscription_string_is_a_type_error():
    with pytest.raises(TypeError):
        QueueOptions(subscriptions="n > 1")  # type: ignore[arg-type]


def test_subscriptions_become_a_tuple():
    assert QueueOptions(subscriptions=["a > 1", "b == 2"]).subscriptions == ("a > 1", "b == 2")


def test_reconnect_delay_grows_with_jitter_and_a_cap():
    policy = ReconnectPolicy(initial_delay=0.1, multiplier=2.0, max_delay=1.0, jitter=0.2)
    rng = random.Random(7)
    delays = [policy.delay(n, rng) for n in range(8)]
    for n, delay in enumerate(delays):
        base = min(1.0, 0.1 * 2**n)
        assert base * 0.8 <= delay <= base * 1.2
    assert len({round(d, 6) for d in delays[4:]}) > 1, "jitter must spread capped delays"


def test_reconnect_without_jitter_is_exact():
    assert ReconnectPolicy(initial_delay=0.5, jitter=0.0).delay(1) == 1.0


@pytest.mark.parametrize("kwargs", [{"multiplier": 0.5}, {"jitter": 2}, {"max_attempts": 0}, {"initial_delay": -1}])
def test_bad_reconnect_policies_are_refused(kwargs):
    with pytest.raises(ValueError):
        ReconnectPolicy(**kwargs)


def test_public_names_are_exported():
    for name in ("Session", "Queue", "Message", "Ack", "AckStatus", "PropertyType", "CompressionAlgorithmType",
                 "SessionOptions", "QueueOptions", "events", "exceptions", "BandwidthLimitError", "PostError"):
        assert name in bmq.__all__ and hasattr(bmq, name)


def test_ack_status_has_the_official_members():
    expected = {"SUCCESS", "UNKNOWN", "TIMEOUT", "NOT_CONNECTED", "CANCELED", "NOT_SUPPORTED", "REFUSED",
                "INVALID_ARGUMENT", "NOT_READY", "LIMIT_BYTES", "LIMIT_MESSAGES", "STORAGE_FAILURE", "UNRECOGNIZED"}
    assert {member.name for member in bmq.AckStatus} == expected


def test_empty_outbox_dir_is_refused_rather_than_using_the_working_directory():
    with pytest.raises(bmq.InvalidArgumentError, match="outbox_dir"):
        bmq.SessionOptions(outbox_dir="")


@pytest.mark.parametrize("kwargs", [
    {"consumer_priority": 2**30}, {"max_unconfirmed_messages": -1}, {"max_unconfirmed_bytes": True},
])
def test_bad_subscription_parameters_are_refused(kwargs):
    with pytest.raises(bmq.InvalidArgumentError):
        bmq.Subscription("n > 1", **kwargs)


def test_a_subscription_takes_the_queue_options_where_it_sets_nothing():
    own = bmq.Subscription("n > 1", max_unconfirmed_messages=3)
    options = QueueOptions(subscriptions=[own, "m > 1"], consumer_priority=4)
    assert [options.consumer_of(e) for e in options.subscriptions] == [(4, 3, 32 << 20), (4, 1000, 32 << 20)]


def test_a_wrong_subscription_expression_is_refused_with_offset_and_reason():
    for make in (lambda: bmq.Subscription("n >>> 5"), lambda: QueueOptions(subscriptions=["n >>> 5"])):
        with pytest.raises(bmq.InvalidArgumentError, match=r"'n >>> 5'.*syntax error.*at offset 3"):
            make()
