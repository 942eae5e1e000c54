"""The subscription expression grammar documented in bmq.broker._subscriptions."""
from __future__ import annotations

import pytest

from bmq.broker import Expression, ExpressionError

PROPS = {"n": 5, "big": 2**40, "s": "abc", "flag": True, "off": False, "c": b"\x07", "blob": b"\x00\x01"}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", True),
        ("n == 5", True),
        ("n != 5", False),
        ("n < 6 && n <= 5 && n > 4 && n >= 5", True),
        ("5 == n", True),
        ("big > 1099511627775", True),
        ("n == -5", False),
        ('s == "abc"', True),
        ('s < "abd"', True),
        ('s == "a\\"c"', False),
        ("flag", True),
        ("off", False),
        ("flag == true && off == false", True),
        ("!flag || n == 5", True),
        ("!(n == 5)", False),
        ("(n == 1 || n == 5) && s != \"x\"", True),
        ("c == 7", True),
        ("missing == 1", False),
        ("!(missing == 1)", True),
        ('n == "5"', False),  # different kinds never compare equal
        ("flag < true", False),
        ("blob == 1", False),
        ("true", True),
        ("false || n == 5", True),
    ],
)
def test_evaluation(text: str, expected: bool) -> None:
    assert Expression(text).matches(PROPS) is expected


@pytest.mark.parametrize("text", ["n ==", "== 5", "(n == 5", "n == 5)", "n = 5", "1 == 2", "n == 5 &&", "n @ 5", '"s"'])
def test_syntax_errors(text: str) -> None:
    with pytest.raises(ExpressionError):
        Expression(text)


@pytest.mark.parametrize(
    "text, offset",
    [
        ("x ~ 5", 2),  # a bad character after a blank: its own offset, not the blank's
        ("n > 'abc", 4),  # a single quote does not start a string
        ('n == "abc', 5),  # an unterminated string: the offset of its opening quote
        ("   @", 3),  # leading blanks
        ("n == 5 && \t #", 12),  # a tab among the blanks
        ("n@5", 1),  # no blank at all
        ("n >>> 5", 3),  # token-level errors name the unexpected token
        ("n == 5  )", 8),
        ("(n == 5 x", 8),
        ("1  ==  2", 0),
    ],
)
def test_syntax_errors_name_the_offending_offset(text: str, offset: int) -> None:
    with pytest.raises(ExpressionError, match=rf"at offset {offset} in "):
        Expression(text)


def test_empty_expression_matches_everything() -> None:
    assert Expression("  ").matches_all
    assert not Expression("n == 1").matches_all
