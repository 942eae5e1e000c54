"""BlazingMQ subscription expressions: one lexer, parser, checker and evaluator for the client
(validation before anything is sent) and the embedded broker (routing).

The language is bmqbrkr's (``bmqeval``, release 0.95.x), re-implemented from its grammar and
rules, with the comparison fix of upstream PR #1551 (see below). In brief::

    expression := expression ("||" | "&&") expression
                | expression ("==" | "!=" | "<" | "<=" | ">" | ">=") expression
                | expression ("+" | "-" | "*" | "/" | "%") expression
                | ("!" | "~" | "-") expression
                | "(" expression ")" | "exists" "(" NAME ")"
                | NAME | INTEGER | STRING | "true" | "false"

Precedence, loosest first: ``||``; ``&&``; ``== !=``; ``< <= > >=``; ``+ -``; ``* / %``;
the unary operators. ``||``, ``&&``, and the arithmetic operators associate to the left; the
comparisons do not associate (``a == b == c`` and ``a < b < c`` are errors). A NAME is
``[A-Za-z][A-Za-z0-9_.]*``; an INTEGER ``-?[0-9]+`` within 64 bits, the minus sign being part
of the number when a digit follows it (so ``n-1`` is ``n`` followed by ``-1``, an error: write
``n - 1``); a STRING is double-quoted, a backslash keeps the next character in the string
but the text is compared as written, backslash included. Blanks are space, tab and newline.

Limits (checked in this order, as bmqbrkr does): at most 128 bytes of UTF-8; the syntax; at
most 10 operators (each property reference, ``exists``, comparison, logical, arithmetic and
unary operator counts one); at least one property; at most 10 property references.

Evaluation (per message): a missing property, a BINARY property, an operand of the wrong type
(``!`` and ``&&``/``||`` need booleans, arithmetic needs integers, a comparison two integers
or two strings), a division or remainder by zero, or ``INT64_MIN / -1`` is an error, and an
error makes the whole expression false (even under ``!``); ``&&`` and ``||`` short-circuit,
so their right side is not evaluated (nor checked) when the left decides. CHAR, SHORT, INT32
and INT64 properties are integers (CHAR as a signed byte); arithmetic wraps around in 64 bits;
division truncates toward zero; strings compare byte-wise in UTF-8. ``exists(x)`` is false for
a missing and for a BINARY property. A comparison with a boolean literal is rewritten first:
``e == true`` and ``e != false`` are ``e``, ``e == false`` and ``e != true`` are ``!e`` (so
``b == true`` works on a BOOL property although booleans do not otherwise compare). bmqbrkr
0.95.14 rewrites ``e != false`` as ``!e`` and ``e != true`` as ``e`` (upstream issue #1523,
fixed by PR #1551): this module follows the fix.

:func:`parse` applies bmqbrkr's compile rules (what the embedded broker accepts);
:func:`check` adds what a client checks before sending: an expression that can never be true,
whatever the message, is refused, naming the part that always fails: an operand that can
never have the type its operator needs (``"a" + 1 > n``, ``!5 && b``, ``(n > 1) == m``), a
division by a constant zero, a result that is never a boolean (``n + 1``), or plain logic
(``n > 1 && false``). It refuses nothing that could select a message: property types are only
known per message, so ``s > 5`` passes (it matches messages whose ``s`` is an integer above
5), and so does ``b || 5`` (true when ``b`` is).

Thread-safety: :class:`Expression` objects are immutable and may be shared between threads.
"""
from __future__ import annotations

from typing import Any, Callable, FrozenSet, List, Mapping, NamedTuple, Optional, Tuple

from . import _codec
from .exceptions import InvalidArgumentError

__all__ = ["Expression", "ExpressionError", "parse", "check", "MAX_LENGTH", "MAX_OPERATORS", "MAX_PROPERTIES"]

MAX_LENGTH = 128
MAX_OPERATORS = 10
MAX_PROPERTIES = 10

# bmqeval's error codes: compilation (the broker logs them) and evaluation.
SYNTAX, NO_PROPERTIES, TOO_COMPLEX, TOO_LONG = -100, -101, -102, -103
E_NAME, E_TYPE, E_BINARY, E_ARITHMETIC, E_UNDEFINED = -1, -2, -3, -4, -5

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class ExpressionError(InvalidArgumentError):
    """A subscription expression that is refused, with where and why.

    Attributes:
        expression: the expression text.
        offset: the character offset the error points at (0-based).
        reason: what is wrong, in words.
        code: bmqeval's error code: -100 syntax, -101 no property, -102 too complex,
            -103 too long; -2 (type) and -4 (arithmetic) for the client's type rules.
    """

    def __init__(self, expression: str, offset: int, reason: str, code: int) -> None:
        super().__init__(f"invalid subscription expression {expression!r}: {reason} (at offset {offset})")
        self.expression = expression
        self.offset = offset
        self.reason = reason
        self.code = code


# ---- lexer -----------------------------------------------------------------------------------

class _Token(NamedTuple):
    kind: str  # "name", "exists", "true", "false", "int", "overflow", "str", "invalid", "end", or the operator text
    text: str
    pos: int


_BLANKS = " \t\n"
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_DIGITS = frozenset("0123456789")
_NAME_CHARS = _LETTERS | _DIGITS | frozenset("_.")
_TWO = {"||": "||", "&&": "&&", "==": "==", "!=": "!=", "<=": "<=", ">=": ">="}
_HINTS = {"=": "compare with '=='", "&": "'and' is '&&'", "|": "'or' is '||'", "'": "strings are in double quotes"}
_ONE = {"(": "(", ")": ")", "!": "!", "~": "!", "<": "<", ">": ">", "+": "+", "-": "-", "*": "*", "/": "/", "%": "%"}


def _tokens(text: str) -> List[_Token]:
    """Every token of ``text`` (longest match first, as flex does), ending with "end"."""
    out: List[_Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _BLANKS:
            i += 1
            continue
        start = i
        if c in _LETTERS:
            while i < n and text[i] in _NAME_CHARS:
                i += 1
            word = text[start:i]
            out.append(_Token(word if word in ("true", "false", "exists") else "name", word, start))
        elif c in _DIGITS or (c == "-" and i + 1 < n and text[i + 1] in _DIGITS):
            i += 1
            while i < n and text[i] in _DIGITS:
                i += 1
            word = text[start:i]
            out.append(_Token("int" if _INT64_MIN <= int(word) <= _INT64_MAX else "overflow", word, start))
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                if text[j] == "\\":
                    if j + 1 >= n or text[j + 1] == "\n":
                        j = n  # a backslash must escape something other than a newline
                        break
                    j += 1
                j += 1
            if j < n:
                out.append(_Token("str", text[i + 1:j], start))
                i = j + 1
            else:
                out.append(_Token("invalid", c, start))
                i += 1
        elif text[i:i + 2] in _TWO:
            out.append(_Token(_TWO[text[i:i + 2]], text[i:i + 2], start))
            i += 2
        elif c in _ONE:
            out.append(_Token(_ONE[c], c, start))
            i += 1
        else:
            out.append(_Token("invalid", c, start))
            i += 1
    out.append(_Token("end", "", n))
    return out


# ---- syntax tree -------------------------------------------------------------------------------

class _Node:
    """One node: ``op`` is "name", "exists", "lit", "!", "neg", a binary operator text."""

    __slots__ = ("op", "pos", "args", "value")

    def __init__(self, op: str, pos: int, args: Tuple["_Node", ...] = (), value: Any = None) -> None:
        self.op = op
        self.pos = pos
        self.args = args
        self.value = value

    def is_bool_literal(self) -> bool:
        return self.op == "lit" and isinstance(self.value, bool)


_COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")
# Binding strength of the binary operators (bmqbrkr's %left / %nonassoc lines).
_PRECEDENCE = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4,
               "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}
_NON_ASSOCIATIVE = (3, 4)
_ARITHMETIC = ("+", "-", "*", "/", "%")


class _Parser:
    """Recursive descent over bmqbrkr's precedence levels; counts operators and properties."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.index = 0
        self.operators = 0
        self.properties = 0

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def take(self) -> _Token:
        token = self.tokens[self.index]
        if token.kind != "end":
            self.index += 1
        return token

    def fail(self, token: _Token, expected: str) -> ExpressionError:
        if token.kind == "end":
            found = "the end of the expression"
        elif token.kind == "invalid" and token.text == '"':
            found = "a '\"' that starts no complete string"
        elif token.kind == "invalid":
            found = f"the character {token.text!r}, which is not part of the language"
            hint = _HINTS.get(token.text)
            if hint:
                found += f" ({hint})"
        elif token.kind == "str":
            found = f'the string "{token.text}"'
        elif token.kind in ("int", "overflow"):
            found = f"the integer {token.text}"
        elif token.kind in ("name", "exists"):
            found = f"the property {token.text}"
        else:
            found = f"{token.text!r}"
        reason = f"syntax error: expected {expected}, found {found}"
        if token.kind in ("int", "overflow") and token.text.startswith("-") and expected.startswith("an operator"):
            reason += f" ('-{token.text[1:]}' is a negative number: put a blank after '-' to subtract)"
        return ExpressionError(self.text, token.pos, reason, SYNTAX)

    def parse(self) -> _Node:
        node = self.binary(1)
        token = self.peek()
        if token.kind != "end":
            raise self.fail(token, "an operator or the end of the expression")
        return node

    def binary(self, minimum: int) -> _Node:
        """Precedence climbing over the binary operators binding at least as tight as ``minimum``."""
        left = self.unary()
        while True:
            token = self.peek()
            level = _PRECEDENCE.get(token.kind, 0)
            if level < minimum or level == 0:
                return left
            self.take()
            right = self.binary(level + 1)
            left = self.combine(token, left, right)
            following = self.peek()
            if level in _NON_ASSOCIATIVE and _PRECEDENCE.get(following.kind) == level:
                raise ExpressionError(
                    self.text, following.pos,
                    f"syntax error: {token.text!r} and {following.text!r} do not chain; use parentheses and '&&'",
                    SYNTAX)

    def combine(self, token: _Token, left: _Node, right: _Node) -> _Node:
        self.operators += 1
        if token.kind in ("==", "!=") and (left.is_bool_literal() or right.is_bool_literal()):
            # Compared with a boolean literal: rewritten at compile time (PR #1551 semantics).
            if left.is_bool_literal() and right.is_bool_literal():
                same = left.value == right.value
                return _Node("lit", token.pos, value=same if token.kind == "==" else not same)
            literal, other = (left, right) if left.is_bool_literal() else (right, left)
            keep = literal.value if token.kind == "==" else not literal.value
            return other if keep else _Node("!", token.pos, (other,))
        return _Node(token.kind, token.pos, (left, right))

    def unary(self) -> _Node:
        token = self.peek()
        if token.kind in ("!", "-"):
            self.take()
            operand = self.unary()
            self.operators += 1
            return _Node("!" if token.kind == "!" else "neg", token.pos, (operand,))
        return self.primary()

    def primary(self) -> _Node:
        token = self.take()
        kind = token.kind
        if kind == "int":
            return _Node("lit", token.pos, value=int(token.text))
        if kind == "overflow":
            raise ExpressionError(self.text, token.pos, f"integer overflow: {token.text} is not within 64 bits", SYNTAX)
        if kind == "str":
            return _Node("lit", token.pos, value=token.text)
        if kind in ("true", "false"):
            return _Node("lit", token.pos, value=kind == "true")
        if kind == "exists" and self.peek().kind == "(":
            self.take()
            name = self.take()
            if name.kind not in ("name", "exists"):
                raise self.fail(name, "a property name")
            closing = self.take()
            if closing.kind != ")":
                raise self.fail(closing, "')'")
            self.properties += 1
            self.operators += 1
            return _Node("exists", token.pos, value=name.text)
        if kind in ("name", "exists"):
            self.properties += 1
            self.operators += 1
            return _Node("name", token.pos, value=token.text)
        if kind == "(":
            node = self.binary(1)
            closing = self.take()
            if closing.kind != ")":
                raise self.fail(closing, "an operator or ')'")
            return node
        raise self.fail(token, "a property, a literal, '(', '!' or '-'")


# ---- evaluation -------------------------------------------------------------------------------

class _Fail(Exception):
    """An evaluation error (bmqeval's code): the whole expression is false."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


#: A property as evaluation sees it: ``(PROPERTY_* type, value)``.
TypedValue = Tuple[int, Any]
_Lookup = Callable[[str], Optional[TypedValue]]
_Eval = Callable[[_Lookup], Any]


def _wrap(value: int) -> int:
    return ((value - _INT64_MIN) & 0xFFFFFFFFFFFFFFFF) + _INT64_MIN


def _property(kind: int, value: Any) -> Any:
    """The evaluation value of a typed property (bool, int, or UTF-8 bytes)."""
    if kind == _codec.PROPERTY_BOOL:
        return bool(value)
    if kind == _codec.PROPERTY_STRING:
        return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)
    if kind == _codec.PROPERTY_CHAR:
        if isinstance(value, (bytes, bytearray)):
            return int.from_bytes(value[:1], "big", signed=True)
        return int(value)
    if kind in (_codec.PROPERTY_SHORT, _codec.PROPERTY_INT32, _codec.PROPERTY_INT64):
        return int(value)
    raise _Fail(E_BINARY)


def _is_int(value: Any) -> bool:
    return type(value) is int


def _compile(node: _Node) -> _Eval:
    """A closure evaluating ``node`` against a property lookup, raising _Fail on errors."""
    op = node.op
    if op == "lit":
        constant = node.value.encode("utf-8", "surrogatepass") if isinstance(node.value, str) else node.value
        return lambda get: constant
    if op == "name":
        name = node.value

        def read(get: _Lookup) -> Any:
            typed = get(name)
            if typed is None:
                raise _Fail(E_NAME)
            try:
                return _property(*typed)
            except (TypeError, ValueError, AttributeError):  # a value that does not fit its type
                raise _Fail(E_UNDEFINED) from None
        return read
    if op == "exists":
        name = node.value

        def exists(get: _Lookup) -> Any:
            typed = get(name)
            return typed is not None and typed[0] != _codec.PROPERTY_BINARY
        return exists
    if op in ("!", "neg"):
        inner = _compile(node.args[0])
        if op == "!":
            def negate(get: _Lookup) -> Any:
                value = inner(get)
                if type(value) is not bool:
                    raise _Fail(E_TYPE)
                return not value
            return negate

        def minus(get: _Lookup) -> Any:
            value = inner(get)
            if not _is_int(value):
                raise _Fail(E_TYPE)
            return _wrap(-value)
        return minus
    left, right = _compile(node.args[0]), _compile(node.args[1])
    if op in ("&&", "||"):
        decisive = op == "||"

        def logical(get: _Lookup) -> Any:
            a = left(get)
            if type(a) is not bool:
                raise _Fail(E_TYPE)
            if a is decisive:
                return a
            b = right(get)
            if type(b) is not bool:
                raise _Fail(E_TYPE)
            return b
        return logical
    if op in _COMPARISONS:
        compare = _COMPARE[op]

        def comparison(get: _Lookup) -> Any:
            a, b = left(get), right(get)
            if isinstance(a, bytes):
                if not isinstance(b, bytes):
                    raise _Fail(E_TYPE)
            elif not (_is_int(a) and _is_int(b)):
                raise _Fail(E_TYPE)
            return compare(a, b)
        return comparison
    arithmetic = _ARITH[op]

    def arith(get: _Lookup) -> Any:
        a, b = left(get), right(get)
        if not (_is_int(a) and _is_int(b)):
            raise _Fail(E_TYPE)
        return arithmetic(a, b)
    return arith


def _divide(a: int, b: int) -> int:
    if b == 0 or (a == _INT64_MIN and b == -1):
        raise _Fail(E_ARITHMETIC)
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


def _remainder(a: int, b: int) -> int:
    return a - _divide(a, b) * b


_COMPARE: Mapping[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}
_ARITH: Mapping[str, Callable[[int, int], int]] = {
    "+": lambda a, b: _wrap(a + b), "-": lambda a, b: _wrap(a - b), "*": lambda a, b: _wrap(a * b),
    "/": _divide, "%": _remainder,
}


# ---- static rules (the client's check) -------------------------------------------------------
# What a node can evaluate to, over every possible message: "T"/"F" (true/false), "i" (an
# integer), "s" (a string); an evaluation error is not an outcome (the empty set: always fails).

_ALL: FrozenSet[str] = frozenset("TFis")
_BOOL: FrozenSet[str] = frozenset("TF")
_INT: FrozenSet[str] = frozenset("i")
_KIND_NAMES = {"T": "a boolean", "F": "a boolean", "i": "an integer", "s": "a string"}


def _describe(outcomes: FrozenSet[str]) -> str:
    names = [_KIND_NAMES[k] for k in "Tis" if k in outcomes or (k == "T" and "F" in outcomes)]
    return " or ".join(names) or "never evaluated without error"


def _has_property(node: _Node) -> bool:
    return node.op in ("name", "exists") or any(_has_property(arg) for arg in node.args)


class _Analysis:
    """The outcomes of every node of one tree, and the type and arithmetic errors met on the
    way (a part that fails whenever it is evaluated), in evaluation order."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.errors: List[ExpressionError] = []

    def fail(self, node: _Node, reason: str, code: int = E_TYPE) -> FrozenSet[str]:
        self.errors.append(ExpressionError(self.text, node.pos, reason, code))
        return frozenset()

    def operand(self, owner: _Node, arg: _Node, kinds: FrozenSet[str], what: str) -> FrozenSet[str]:
        """``arg``'s outcomes within ``kinds``; an error when it has outcomes, none of them fit."""
        found = self.outcomes(arg)
        if found and not found & kinds:
            self.fail(arg, f"type error: {what} at offset {owner.pos} needs {_describe(kinds)}, "
                           f"this operand is {_describe(found)}")
        return found & kinds

    def outcomes(self, node: _Node) -> FrozenSet[str]:
        result = self._outcomes(node)
        if result and node.op != "lit" and not _has_property(node):
            try:  # a constant: its one value (or its one failure)
                value = _compile(node)(lambda name: None)
            except _Fail:
                return self.fail(node, "arithmetic error: a constant part divides by zero or overflows "
                                       "(-9223372036854775808 / -1)", E_ARITHMETIC)
            result = frozenset(("T" if value else "F") if isinstance(value, bool) else
                               "i" if isinstance(value, int) else "s")
        return result

    def _outcomes(self, node: _Node) -> FrozenSet[str]:
        op = node.op
        if op == "lit":
            value = node.value
            if isinstance(value, bool):
                return frozenset("T" if value else "F")
            return frozenset("i" if isinstance(value, int) else "s")
        if op == "name":
            return _ALL
        if op == "exists":
            return _BOOL
        if op == "!":
            inner = self.operand(node, node.args[0], _BOOL, "'!'")
            return frozenset({"T": "F", "F": "T"}[k] for k in inner)
        if op == "neg":
            return self.operand(node, node.args[0], _INT, "unary '-'")
        left_node, right_node = node.args
        if op in ("&&", "||"):
            left = self.operand(node, left_node, _BOOL, repr(op))
            decisive, other = ("T", "F") if op == "||" else ("F", "T")
            result = left & frozenset(decisive)
            if other in left:
                result |= self.operand(node, right_node, _BOOL, repr(op))
            return result
        if op in _COMPARISONS:
            left = self.operand(node, left_node, frozenset("is"), repr(op))
            right = self.operand(node, right_node, frozenset("is"), repr(op))
            if not left or not right:
                return frozenset()
            if not left & right:
                return self.fail(node, f"type error: {op!r} compares two integers or two strings, not "
                                       f"{_describe(left)} with {_describe(right)}")
            return _BOOL
        left = self.operand(node, left_node, _INT, repr(op))
        right = self.operand(node, right_node, _INT, repr(op))
        if not left or not right:
            return frozenset()
        if op in ("/", "%") and not _has_property(right_node) and _compile(right_node)(lambda name: None) == 0:
            return self.fail(node, f"arithmetic error: division by zero ({op!r} by a constant 0)", E_ARITHMETIC)
        return _INT


def _refusal(text: str, tree: _Node) -> Optional[ExpressionError]:
    """Why ``tree`` can never be true, whatever the message, or None when it can be."""
    analysis = _Analysis(text)
    result = analysis.outcomes(tree)
    if "T" in result:
        return None
    if analysis.errors:
        return analysis.errors[-1]  # the last failure met is the one that decides
    if result & _BOOL:
        return ExpressionError(text, 0, "it can never be true (whatever the message's properties)", E_TYPE)
    return ExpressionError(text, 0, f"type error: the expression is {_describe(result)}, not a condition", E_TYPE)


# ---- public API -------------------------------------------------------------------------------

Properties = Mapping[str, Any]


class Expression:
    """A compiled subscription expression (see the module docstring for the language).

    Args:
        text: the expression; empty matches everything, as bmqbrkr treats a subscription
            without expression (blanks only are a syntax error, as there).

    Raises:
        ExpressionError: ``text`` breaks bmqbrkr's compile rules (syntax, limits).

    Thread-safety: immutable after construction; ``matches`` may run on any thread.
    """

    __slots__ = ("text", "_evaluate", "_tree")

    def __init__(self, text: str) -> None:
        self.text = text
        self._tree: Optional[_Node] = None
        self._evaluate: Optional[_Eval] = None
        if text:
            self._tree = _parse_tree(text)
            self._evaluate = _compile(self._tree)

    @property
    def matches_all(self) -> bool:
        """True for the empty expression (a subscription without expression)."""
        return self._evaluate is None

    def evaluate(self, get: Callable[[str], Optional[TypedValue]]) -> bool:
        """Whether a message whose property ``name`` is ``get(name)`` is selected.

        Args:
            get: returns ``(PROPERTY_* type, value)`` of a property, or None when the message
                has none of that name.

        Returns:
            True when the expression evaluates to true without error.
        """
        if self._evaluate is None:
            return True
        try:
            return self._evaluate(get) is True
        except _Fail:
            return False

    def matches(self, properties: Properties, types: Optional[Mapping[str, int]] = None) -> bool:
        """Whether a message with ``properties`` is selected.

        Args:
            properties: ``{name: value}`` (as :attr:`bmq.Message.properties`).
            types: ``{name: PropertyType}`` (as :attr:`bmq.Message.property_types`); without it
                the type is inferred: bool BOOL, int INT64, str STRING, bytes BINARY.

        Returns:
            True when the expression evaluates to true without error.
        """
        def get(name: str) -> Optional[TypedValue]:
            if name not in properties:
                return None
            value = properties[name]
            if types is not None and name in types:
                return int(types[name]), value
            return _infer(value), value
        return self.evaluate(get)

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


def _infer(value: Any) -> int:
    if isinstance(value, bool):
        return _codec.PROPERTY_BOOL
    if isinstance(value, int):
        return _codec.PROPERTY_INT64
    if isinstance(value, str):
        return _codec.PROPERTY_STRING
    return _codec.PROPERTY_BINARY


def _parse_tree(text: str) -> _Node:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_LENGTH:
        raise ExpressionError(text, MAX_LENGTH, f"too long: {size} bytes in UTF-8, at most {MAX_LENGTH}", TOO_LONG)
    parser = _Parser(text)
    tree = parser.parse()
    if parser.operators > MAX_OPERATORS:
        raise ExpressionError(text, 0, f"too complex: {parser.operators} operators (each property reference "
                              f"counts one), at most {MAX_OPERATORS}", TOO_COMPLEX)
    if parser.properties == 0:
        raise ExpressionError(text, 0, "uses no property: it would select every message or none", NO_PROPERTIES)
    if parser.properties > MAX_PROPERTIES:
        raise ExpressionError(text, 0, f"too complex: {parser.properties} property references, "
                              f"at most {MAX_PROPERTIES}", TOO_COMPLEX)
    return tree


def parse(text: str) -> Expression:
    """Compile ``text`` with bmqbrkr's rules (what bmqbrkr would compile, the embedded broker does).

    Args:
        text: the expression.

    Returns:
        The compiled :class:`Expression`.

    Raises:
        ExpressionError: syntax error or a limit exceeded; ``code`` is bmqbrkr's rc.
    """
    return Expression(text)


def check(text: object) -> Expression:
    """Compile ``text`` as a client does before sending it: bmqbrkr's rules and the type rules.

    Args:
        text: the expression (a non-empty str).

    Returns:
        The compiled :class:`Expression`.

    Raises:
        ExpressionError: why and where ``text`` is refused (an :class:`bmq.InvalidArgumentError`).
        ArgumentTypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        from .exceptions import ArgumentTypeError

        raise ArgumentTypeError(f"a subscription expression must be a str, not {type(text).__name__}")
    if not text:
        raise ExpressionError(text, 0, "empty: a queue without subscriptions receives every message", SYNTAX)
    expression = Expression(text)
    assert expression._tree is not None
    refusal = _refusal(text, expression._tree)
    if refusal is not None:
        raise refusal
    return expression
