"""The differential corpus of subscription expressions: every expression is run against every
message of :data:`MESSAGES`, so the (expression, message properties) cases are their product.

It covers every operator (``|| && == != < <= > >= + - * / % ! ~``, unary minus, ``exists``),
every property type (BOOL, CHAR, SHORT, INT32, INT64, STRING, BINARY), the evaluation-time
rules (missing properties, type mismatches, 64-bit wrap-around, division by zero and
``INT64_MIN / -1``, byte-wise string comparison, short-circuits, precedence, comparisons with
boolean literals) and texts bmqbrkr cannot compile (syntax, no property, too complex, too long),
which it accepts and lets match every message.

:data:`RELEASED` maps an expression to how bmqbrkr 0.95.14 evaluates it where that release
differs from the fixed semantics because of upstream issue #1523 (fixed by PR #1551): there a
comparison of anything with a boolean literal by ``!=`` is rewritten as ``==`` would be.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from bmq import _codec

BOOL, CHAR, SHORT, INT32, INT64, STRING, BINARY = (
    _codec.PROPERTY_BOOL, _codec.PROPERTY_CHAR, _codec.PROPERTY_SHORT, _codec.PROPERTY_INT32,
    _codec.PROPERTY_INT64, _codec.PROPERTY_STRING, _codec.PROPERTY_BINARY)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

Properties = Dict[str, Tuple[int, Any]]

#: One message per entry (its properties); names: n, m (numbers), s, t (strings), b, f
#: (booleans), c (CHAR), h (SHORT), l (INT64), z (BINARY).
MESSAGES: List[Properties] = [
    {},
    {"n": (INT32, 5), "m": (INT32, 3), "s": (STRING, "abc"), "t": (STRING, "abd"), "b": (BOOL, True),
     "f": (BOOL, False), "c": (CHAR, b"A"), "h": (SHORT, -2), "l": (INT64, 2**62), "z": (BINARY, b"\x01")},
    {"n": (INT32, -7), "m": (INT32, 2), "s": (STRING, "ab"), "t": (STRING, "ab"), "b": (BOOL, False),
     "f": (BOOL, True), "c": (CHAR, b"\xff"), "h": (SHORT, 300), "l": (INT64, INT64_MIN), "z": (BINARY, b"\x00\x01")},
    {"n": (INT64, INT64_MAX), "m": (INT64, -1), "s": (STRING, ""), "t": (STRING, "é"), "b": (BOOL, True),
     "l": (INT64, INT64_MAX), "h": (SHORT, -32768), "c": (CHAR, b"\x00")},
    {"n": (STRING, "5"), "m": (BOOL, True), "s": (INT32, 5), "t": (BINARY, b"abd"), "b": (INT32, 1),
     "f": (STRING, "false")},
    {"n": (INT32, 0), "m": (INT32, 0), "s": (STRING, "ABC"), "t": (STRING, "abc"), "b": (BOOL, False),
     "f": (BOOL, False), "l": (INT64, -1)},
    {"n": (SHORT, 5), "m": (CHAR, b"\x03"), "s": (STRING, "z"), "t": (STRING, "\u00e9t\u00e9"), "b": (BOOL, True),
     "f": (BOOL, True), "h": (SHORT, 5), "l": (INT64, 5)},
    {"n": (CHAR, b"\x05"), "m": (INT64, 3), "s": (STRING, "a\\\"b"), "t": (STRING, 'a"b'), "f": (BOOL, False)},
    {"n": (BOOL, True), "s": (BINARY, b"abc"), "b": (STRING, "true"), "z": (INT32, 1)},
    {"n": (INT32, 10), "m": (INT32, 4), "s": (STRING, "abc "), "t": (STRING, "abc"), "b": (BOOL, True),
     "f": (BOOL, False), "c": (CHAR, b"a"), "h": (SHORT, 10), "l": (INT64, 10)},
]

EXPRESSIONS: List[str] = [
    # comparisons of integers, every integer type
    "n == 5", "n != 5", "n < 5", "n <= 5", "n > 5", "n >= 5", "5 == n", "-7 == n",
    "c == 65", "c < 0", "c == -1", "h == -2", "h > 255", "h == -32768", "l == 4611686018427387904",
    "l == -9223372036854775808", "l == 9223372036854775807", "n == m", "n > m",
    # strings: equality, byte-wise order (UTF-8), prefixes, escapes kept as written
    's == "abc"', 's != "abc"', 's < t', 's <= t', 's > t', 's >= "ab"', 't > "z"', 's < "abc "',
    's == "a\\"b"', 't == "a\\"b"', 's == ""', 's < "B"',
    # booleans: bare, negated, compared with literals (incl. #1523), not comparable otherwise
    "b", "!b", "~b", "b == true", "b == false", "true == b", "b != true", "b != false", "false != b",
    "b == f", "b < true", "b && f", "b || f", "!(b && f)", "(n > 1) == true", "(n > 1) != false",
    "(n > 1) == (m > 1)",
    # logical operators: short-circuit over errors, precedence of && over ||
    "b || missing", "missing || b", "f && missing", "missing && f", "b || f && f", "(b || f) && f",
    "!exists(n) || n > 0", "exists(n) && n > 0",
    # exists: every type, BINARY counts as absent; a property named exists
    "exists(n)", "exists(z)", "!exists(z)", "exists(missing)", "exists", "exists(exists)",
    # arithmetic: precedence, associativity, truncation, remainder sign, wrap-around, errors
    "n + m == 8", "n - m == 2", "n * m == 15", "n / m == 1", "n % m == 2", "n + m * 2 == 11",
    "(n + m) * 2 == 16", "n - m - 1 == 1", "n / 2 == -3", "n % 2 == -1", "n % -3 == 2", "-n == 7", "- n < 0",
    "--n == 5", "n + 1 < n", "l + l == 0", "l * 2 < 0", "-l == l", "n / 0 == 1", "!(n / 0 == 1)",
    "n % (m - m) == 0", "l / m == 1", "l / m < 0", "h * h == 4", "c + 1 == 66", "n + s > 0", "-s < 0",
    "n > 5 == b", "n > 5 == true", "n == 5 < m",
    # texts bmqbrkr cannot compile: syntax, no property, too complex, too long
    "n >>> 5", "n-1 > 0", "n = 5", "a == b == c", "n < m <= 5", "exists(5)", '"abc', "_n > 1", "n > 1.5",
    "n > 9223372036854775808", "false", "1 == 1", '"a" < "b"', "n > 1 && n > 2 && n > 3 && n > 4",
    "!!!!!!!!!!n", "n == " + "1" * 124, "n == " + "1" * 18 + " && s == " + '"' + "x" * 100 + '"',
]

#: How bmqbrkr 0.95.14 evaluates these (upstream issue #1523): ``!=`` with a boolean literal
#: is rewritten as ``==`` with it.
RELEASED: Dict[str, str] = {
    "b != true": "b == true",
    "b != false": "b == false",
    "false != b": "false == b",
    "(n > 1) != false": "(n > 1) == false",
}


def cases() -> List[Tuple[str, Properties]]:
    """Every (expression, message properties) case of the corpus."""
    return [(text, props) for text in EXPRESSIONS for props in MESSAGES]


_NAMES = ("n", "m", "s", "t", "b", "f", "c", "h", "l", "z", "missing", "exists")
_LITERALS = ("0", "1", "-1", "5", "-7", "2", "3", "300", "9223372036854775807", "-9223372036854775808", '"abc"',
             '"ab"', '""', '"z"', '"\u00e9"', "true", "false")
_BINARY = ("||", "&&", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%")


def generated(count: int, seed: int) -> List[str]:
    """``count`` random expressions (seeded): well-formed trees over the corpus's properties
    and every operator, with blanks varied and, for one in five, a token dropped, doubled or
    swapped (syntax errors, chained comparisons, texts that become valid another way)."""
    import random

    rng = random.Random(seed)

    def tree(depth: int) -> List[str]:
        roll = rng.random()
        if depth <= 0 or roll < 0.3:
            pick = rng.random()
            if pick < 0.5:
                return [rng.choice(_NAMES)]
            if pick < 0.6:
                return ["exists", "(", rng.choice(_NAMES), ")"]
            return [rng.choice(_LITERALS)]
        if roll < 0.42:
            return [rng.choice(("!", "~", "-"))] + tree(depth - 1)
        if roll < 0.52:
            return ["("] + tree(depth - 1) + [")"]
        return tree(depth - 1) + [rng.choice(_BINARY)] + tree(depth - 1)

    out: List[str] = []
    while len(out) < count:
        tokens = tree(rng.randint(1, 4))
        if rng.random() < 0.2 and len(tokens) > 1:
            i = rng.randrange(len(tokens))
            action = rng.random()
            if action < 0.34:
                del tokens[i]
            elif action < 0.67:
                tokens.insert(i, tokens[i])
            else:
                j = rng.randrange(len(tokens))
                tokens[i], tokens[j] = tokens[j], tokens[i]
        text = "".join(token + rng.choice(("", " ", " ", "\t")) for token in tokens).strip()
        if text and text not in out:
            out.append(text)
    return out
