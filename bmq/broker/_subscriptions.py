"""Subscription expressions: a small, documented subset of BlazingMQ's expression language.

Grammar (whitespace between tokens is ignored)::

    expression  := or
    or          := and ( "||" and )*
    and         := unary ( "&&" unary )*
    unary       := "!" unary | primary
    primary     := "(" expression ")" | comparison | NAME | "true" | "false"
    comparison  := operand OP operand        (at least one operand is a NAME)
    operand     := NAME | INTEGER | STRING | "true" | "false"
    OP          := "==" | "!=" | "<" | "<=" | ">" | ">="
    NAME        := [A-Za-z_][A-Za-z0-9_.]*   (a message property name)
    INTEGER     := "-"? [0-9]+
    STRING      := '"' characters, with \\" and \\\\ escapes '"'

Semantics, chosen to match the broker's evaluator where it matters:

* A NAME is replaced by the message's property value. A message without that property does
  not match any comparison that mentions it (``!`` of such a comparison does match).
* Integers compare with every integer-typed property (SHORT, INT32, INT64, CHAR as its
  signed byte value); strings with STRING properties; ``true``/``false`` with BOOL. A
  comparison between different kinds is false (not an error).
* A bare NAME is true when the property is a BOOL with value true.
* The empty expression (the default subscription) matches every message.

Thread-safety: compiled :class:`Expression` objects are immutable and may be shared.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

__all__ = ["Expression", "ExpressionError", "compile_expression"]

Properties = Mapping[str, Any]
_Eval = Callable[[Properties], Optional[bool]]

_TOKEN = re.compile(
    r"""(?:
        (?P<op>==|!=|<=|>=|<|>|&&|\|\||!|\(|\))
      | (?P<int>-?[0-9]+)
      | (?P<str>"(?:[^"\\]|\\.)*")
      | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
    )""",
    re.VERBOSE,
)
_COMPARATORS: Dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}
_MISSING = object()


class ExpressionError(ValueError):
    """A subscription expression that does not follow the supported grammar."""


class Expression:
    """A compiled subscription expression.

    Args:
        text: the expression source; empty means "match everything".

    Raises:
        ExpressionError: ``text`` does not parse.

    Thread-safety: immutable after construction; ``matches`` may run on any thread.
    """

    __slots__ = ("text", "_evaluate")

    def __init__(self, text: str) -> None:
        self.text = text
        self._evaluate: Optional[_Eval] = _Parser(text).parse() if text.strip() else None

    @property
    def matches_all(self) -> bool:
        """True for the empty expression."""
        return self._evaluate is None

    def matches(self, properties: Properties) -> bool:
        """Whether a message with ``properties`` (name -> plain value) is selected."""
        if self._evaluate is None:
            return True
        return bool(self._evaluate(properties))

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


def compile_expression(text: str) -> Expression:
    """Compile ``text`` (see the module docstring for the grammar).

    Raises:
        ExpressionError: ``text`` does not parse.
    """
    return Expression(text)


class _Literal:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Name:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (bytes, bytearray)) and len(value) == 1:
        return "int"  # CHAR property: compares as its signed byte value
    return "other"


def _plain(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)) and len(value) == 1:
        return int.from_bytes(value, "big", signed=True)
    return value


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: List[Tuple[str, str, int]] = []
        # Whitespace is skipped before matching so that an error names the offending
        # character's offset, not the offset of the blank that precedes it.
        pos = _skip_space(text, 0)
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None:
                raise ExpressionError(f"unexpected character at offset {pos} in {text!r}")
            kind = match.lastgroup or ""
            self.tokens.append((kind, match.group(kind), pos))
            pos = _skip_space(text, match.end())
        self.index = 0

    def _peek(self) -> Optional[Tuple[str, str, int]]:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def _take(self) -> Tuple[str, str, int]:
        token = self._peek()
        if token is None:
            raise ExpressionError(f"unexpected end of expression {self.text!r}")
        self.index += 1
        return token

    def _error(self, token: Tuple[str, str, int], what: str) -> ExpressionError:
        return ExpressionError(f"{what} {token[1]!r} at offset {token[2]} in {self.text!r}")

    def parse(self) -> _Eval:
        result = self._or()
        token = self._peek()
        if token is not None:
            raise self._error(token, "unexpected")
        return result

    def _or(self) -> _Eval:
        terms = [self._and()]
        while self._peek() is not None and self._peek()[1] == "||":  # type: ignore[index]
            self._take()
            terms.append(self._and())
        if len(terms) == 1:
            return terms[0]
        return lambda props: any(term(props) for term in terms)

    def _and(self) -> _Eval:
        terms = [self._unary()]
        while self._peek() is not None and self._peek()[1] == "&&":  # type: ignore[index]
            self._take()
            terms.append(self._unary())
        if len(terms) == 1:
            return terms[0]
        return lambda props: all(term(props) for term in terms)

    def _unary(self) -> _Eval:
        token = self._peek()
        if token is not None and token[1] == "!":
            self._take()
            inner = self._unary()
            return lambda props: not inner(props)
        return self._primary()

    def _primary(self) -> _Eval:
        token = self._take()
        if token[1] == "(":
            inner = self._or()
            closing = self._take()
            if closing[1] != ")":
                raise self._error(closing, "expected ')' but found")
            return inner
        left = self._operand(token)
        following = self._peek()
        if following is not None and following[1] in _COMPARATORS:
            self._take()
            right = self._operand(self._take())
            return self._comparison(left, following[1], right, token)
        if isinstance(left, _Name):
            name = left.name
            return lambda props: props.get(name) is True
        if isinstance(left.value, bool):
            constant = left.value
            return lambda props: constant
        raise self._error(token, "expected a comparison after")

    def _operand(self, token: Tuple[str, str, int]) -> Any:
        kind, text, _ = token
        if kind == "int":
            return _Literal(int(text))
        if kind == "str":
            return _Literal(re.sub(r"\\(.)", r"\1", text[1:-1]))
        if kind == "name":
            if text in ("true", "false"):
                return _Literal(text == "true")
            return _Name(text)
        raise self._error(token, "expected a property name or literal, found")

    def _comparison(self, left: Any, op: str, right: Any, token: Tuple[str, str, int]) -> _Eval:
        if not isinstance(left, _Name) and not isinstance(right, _Name):
            raise self._error(token, "a comparison needs a property name, found")
        compare = _COMPARATORS[op]

        def resolve(operand: Any, props: Properties) -> Any:
            if isinstance(operand, _Name):
                return props.get(operand.name, _MISSING)
            return operand.value

        def evaluate(props: Properties) -> bool:
            a = resolve(left, props)
            b = resolve(right, props)
            if a is _MISSING or b is _MISSING:
                return False
            kind = _kind(a)
            if kind == "other" or kind != _kind(b):
                return False
            a, b = _plain(a), _plain(b)
            if kind == "bool" and op not in ("==", "!="):
                return False
            return compare(a, b)

        return evaluate
