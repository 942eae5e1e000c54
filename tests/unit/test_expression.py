"""bmq._expression: the subscription language as bmqbrkr compiles and evaluates it, and the
client's extra type rules. The evaluation rules are pinned down against bmqbrkr itself by the
differential corpus (tests/integration/test_subscription_corpus.py); here each rule has a
small, readable example, and the parser is fuzzed."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bmq
from bmq import _codec
from bmq import _expression as ex
from bmq._expression import ExpressionError, check, parse

pytestmark = pytest.mark.timeout(60)

PROPS = {"n": 5, "m": -3, "big": 2**62, "s": "abc", "t": "abd", "b": True, "off": False, "u": "é"}
TYPES = {"n": _codec.PROPERTY_INT32, "m": _codec.PROPERTY_SHORT, "big": _codec.PROPERTY_INT64,
         "s": _codec.PROPERTY_STRING, "t": _codec.PROPERTY_STRING, "b": _codec.PROPERTY_BOOL,
         "off": _codec.PROPERTY_BOOL, "u": _codec.PROPERTY_STRING}


def matches(text: str, props=PROPS, types=TYPES) -> bool:
    return parse(text).matches(props, types)


@pytest.mark.parametrize("text, expected", [
    # comparisons of integers, of strings (byte-wise UTF-8)
    ("n == 5", True), ("n != 5", False), ("n < 6 && n <= 5 && n > 4", True), ("n >= 5 && 5 >= n", True),
    ("5 == n", True),
    ('s < t', True), ('s == "abc"', True), ('u > "z"', True), ('s < "abcd"', True),
    # arithmetic: precedence, truncating division, remainder sign, 64-bit wrap-around
    ("n + 2 * 3 == 11", True), ("(n + 2) * 3 == 21", True), ("n - 2 - 2 == 1", True),
    ("m / 2 == -1", True), ("m % 2 == -1", True), ("n % -3 == 2", True),
    ("big * 2 < 0", True), ("big + big + big + big == 0", True), ("- n == -5", True), ("-n == -5", True),
    # booleans: bare, with a literal (rewritten), not comparable otherwise
    ("b", True), ("off", False), ("!off", True), ("~off", True), ("b == true", True), ("b != false", True),
    ("off != true", True), ("off == false", True), ("b != true", False), ("b == off", False), ("b < true", False),
    # errors make the whole expression false, even under "!"
    ("missing == 1", False), ("!(missing == 1)", False), ("s > 5", False), ("!(s > 5)", False),
    ("n / (n - 5) == 1", False), ("!(n / (n - 5) == 1)", False), ("n", False), ("s", False),
    # short-circuit: the skipped side is not evaluated
    ("b || missing", True), ("off && missing", False), ("exists(missing) && missing > 1", False),
    ("!exists(missing) || missing > 1", True), ("exists(n)", True), ("exists", False),
    # precedence: && over ||, unary over everything
    ("b || off && off", True), ("(b || off) && off", False), ("!b == false", True),
])
def test_evaluation(text: str, expected: bool) -> None:
    assert matches(text) is expected


def test_char_is_a_signed_byte_and_binary_is_never_readable() -> None:
    types = {"c": _codec.PROPERTY_CHAR, "blob": _codec.PROPERTY_BINARY}
    assert parse("c == -1").matches({"c": b"\xff", "blob": b"\x01"}, types)
    assert not parse("blob == 1").matches({"c": b"\xff", "blob": b"\x01"}, types)
    assert not parse("exists(blob)").matches({"c": b"\xff", "blob": b"\x01"}, types)


def test_plain_values_infer_their_types() -> None:
    assert parse('n > 1 && s == "x" && b').matches({"n": 2, "s": "x", "b": True})


@pytest.mark.parametrize("text, offset, code, words", [
    ("n >>> 5", 3, ex.SYNTAX, "found '>'"),
    ("n-1 > 0", 1, ex.SYNTAX, "negative number"),
    ("a == b == c", 7, ex.SYNTAX, "do not chain"),
    ("a < b <= c", 6, ex.SYNTAX, "do not chain"),
    ("n = 5", 2, ex.SYNTAX, "'='"),
    ("(n == 5", 7, ex.SYNTAX, "')'"),
    ("n == 5)", 6, ex.SYNTAX, "')'"),
    ('n == "abc', 5, ex.SYNTAX, "no complete string"),
    ("n @ 5", 2, ex.SYNTAX, "'@'"),
    ("_n > 1", 0, ex.SYNTAX, "'_'"),
    ("n > 1.5", 5, ex.SYNTAX, "'.'"),
    ("n\r> 1", 1, ex.SYNTAX, "'\\r'"),
    ("exists(5)", 7, ex.SYNTAX, "property name"),
    ("n > 9223372036854775808", 4, ex.SYNTAX, "overflow"),
    ("   ", 3, ex.SYNTAX, "end of the expression"),
    ("false", 0, ex.NO_PROPERTIES, "no property"),
    ('"x" == "x"', 0, ex.NO_PROPERTIES, "no property"),
    ("n > 1 && n > 2 && n > 3 && n > 4", 0, ex.TOO_COMPLEX, "11 operators"),
    ("x" * 129, 128, ex.TOO_LONG, "129 bytes"),
    ("s == " + '"' + "é" * 62 + '"', 128, ex.TOO_LONG, "bytes in UTF-8"),
])
def test_compile_errors_name_offset_and_reason(text: str, offset: int, code: int, words: str) -> None:
    with pytest.raises(ExpressionError) as info:
        parse(text)
    assert (info.value.offset, info.value.code) == (offset, code)
    assert words in info.value.reason
    assert repr(text) in str(info.value) and f"offset {offset}" in str(info.value)


@pytest.mark.parametrize("text", [
    "n > -9223372036854775808", "n < 9223372036854775807", "exists(exists)", "exists", "exists.x > 1",
    "truex", "a.b_c.1 == 1", "b || 5", "n > 1 || 1 / 0 == 1", "s > 5", 's == "a\\"b"', "n>-1", "n - -1 == 6",
    "--n == 5", "!!b", "a < b == true",
    "(" * 63 + "n" + ")" * 63, "\tn\n>\t1 ", "n > 1 && n > 2 && n > 3",
])
def test_valid_expressions_compile_and_pass_the_type_rules(text: str) -> None:
    parse(text)
    check(text)


def test_string_escapes_are_kept_as_written() -> None:
    expression = parse('s == "a\\"b"')
    assert expression.matches({"s": 'a\\"b'}) and not expression.matches({"s": 'a"b'})


@pytest.mark.parametrize("text, offset, words", [
    ('"x" + 1 > n', 0, "'+' at offset 4 needs an integer"),
    ("!5 || b", 1, "'!' at offset 0 needs a boolean"),
    ("b && 5", 5, "needs a boolean"),
    ("n > 1 && false", 0, "can never be true"),
    ("n + 1", 0, "not a condition"),
    ('n > 1 == "x"', 2, "needs an integer or a string"),
    ('n == "x" + 1', 5, "needs an integer"),
    ("n > 5 / 0", 6, "division by zero"),
    ("n > -9223372036854775808 / -1", 25, "overflow"),
    ("5 == true && b", 0, "needs a boolean"),
    ("n == 5 < m", 7, "needs an integer or a string"),  # n == (5 < m): a boolean never compares
])
def test_what_can_never_be_true_is_refused_naming_the_part_that_always_fails(text: str, offset: int,
                                                                            words: str) -> None:
    parse(text)  # bmqbrkr compiles it...
    with pytest.raises(ExpressionError) as info:
        check(text)  # ...and the client refuses it
    assert info.value.offset == offset and words in info.value.reason
    assert isinstance(info.value, bmq.InvalidArgumentError)


def test_check_refuses_empty_and_non_strings() -> None:
    with pytest.raises(bmq.InvalidArgumentError):
        check("")
    with pytest.raises(bmq.ArgumentTypeError):
        check(5)


def test_empty_expression_matches_everything() -> None:
    assert parse("").matches_all and parse("").matches({})
    assert not parse("n == 1").matches_all


# The language's characters, weighted towards its tokens, so that generated texts get deep.
_PIECES = st.sampled_from(["n", "s", "b", "exists", "(", ")", "!", "~", "-", "+", "*", "/", "%", "==", "!=",
                           "<", "<=", ">", ">=", "&&", "||", "1", "-1", '"a"', '"', "\\", " ", "true", "false",
                           "9223372036854775808", "é", "\n", "\r", "@", "."])


# 3000 texts: seconds on a quiet machine, over the module's 60 s bound at load average 25-40
# (seen twice); a parser that loops still hits this one.
@pytest.mark.timeout(300)
@settings(max_examples=3000, deadline=None, derandomize=True)
@given(st.lists(_PIECES, max_size=60).map("".join) | st.text(max_size=140))
def test_parser_never_crashes_on_any_text(text: str) -> None:
    try:
        expression = parse(text)
    except ExpressionError as exc:
        assert 0 <= exc.offset <= max(len(text), ex.MAX_LENGTH) and exc.code in (-100, -101, -102, -103)
        return
    expression.matches(PROPS, TYPES)
    expression.matches({})
    try:
        check(text)
    except ExpressionError as exc:
        assert exc.code in (-100, ex.E_TYPE, ex.E_ARITHMETIC)
        if not text:
            return  # the empty text: a queue takes no subscription for "everything"
        # Refused only when it can never be true: on no message at all.
        for props, types in ((PROPS, TYPES), ({"n": "x", "s": 1, "b": 1}, None), ({"n": True, "s": True}, None)):
            assert not expression.matches(props, types)


@pytest.mark.parametrize("text", ["(" * 128, "!" * 128, "-" * 127 + "1", "(" * 64 + ")" * 64, "-(" * 64])
def test_deep_nesting_is_bounded(text: str) -> None:
    with pytest.raises(ExpressionError):
        parse(text)
