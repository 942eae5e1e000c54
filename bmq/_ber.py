"""BER half of the control-message schema codec (protocol §8.6), as BDE balber writes it.

Walks the schema table of :mod:`bmq._schema`; use that module's public functions rather
than this one. Constructed values use indefinite lengths on encode; the decoder also accepts
definite lengths, skips unknown elements, and bounds nesting and lengths so that hostile
bytes only ever raise :class:`~bmq.exceptions.ProtocolError`.

Thread-safety: every function is pure and safe to call from any thread.
"""
from __future__ import annotations

from typing import Any, Dict, Generator, Mapping, Optional, Tuple

from ._ctrlmsg import (
    Field,
    CHOICES, CHOICE_BY_NAME, ENUMS, ENUM_BY_VALUE, FIELDS, INT_RANGES, check_keys, check_scalar, selection_of,
)
from .exceptions import ProtocolError
_CONTEXT = 2  # tag class of every element below the top level
_SEQUENCE_TAG = 0x10  # universal SEQUENCE: the top level and every array element
_CONSTRUCTED = 0x20
_MAX_DEPTH = 32  # far deeper than the schema; bounds skipping of unknown nested elements
_MAX_LENGTH_OCTETS = 4


def encode(message: Mapping, top: str) -> bytes:
    """BER body of ``message`` as the top-level sequence ``top`` (universal SEQUENCE)."""
    buf = bytearray(b"\x30\x80")
    _ber_sequence_content(buf, message, top)
    buf += b"\0\0"
    return bytes(buf)


def decode(body: bytes, top: str) -> dict:
    """Inverse of :func:`encode`; raises ProtocolError."""
    return _BerDecoder(body).decode_top(top)


def _ber_length(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    octets = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes((0x80 | len(octets),)) + octets


def _ber_int(value: int) -> bytes:
    # minimal two's complement; a non-negative value whose top bit would be set gets 00
    magnitude = value if value >= 0 else ~value
    return value.to_bytes(magnitude.bit_length() // 8 + 1, "big", signed=True)


def _ber_primitive(buf: bytearray, tag: int, value: Any, type_name: str, where: str) -> None:
    value = check_scalar(value, type_name, where)
    if type_name in INT_RANGES:
        content = _ber_int(value)
    elif type_name in ENUMS:
        content = _ber_int(ENUMS[type_name][value])
    elif type_name == "boolean":
        content = b"\x01" if value else b"\x00"
    elif type_name == "string":
        # surrogateescape: strings decoded from non-UTF-8 octets re-encode unchanged
        content = value.encode("utf-8", "surrogateescape")
    else:  # base64Binary
        content = bytes(value)
    buf.append(0x80 | tag)
    buf += _ber_length(len(content))
    buf += content


def _ber_sequence_content(buf: bytearray, msg: Mapping, seq: str) -> None:
    check_keys(msg, seq)
    for f in FIELDS[seq]:
        if f.name is None:
            name, value = selection_of(msg, f.type)
            sel, type_name = CHOICE_BY_NAME[f.type][name]
            buf += bytes((0xA0 | f.tag, 0x80))
            _ber_element(buf, sel, value, type_name, name)
            buf += b"\0\0"
            continue
        value = msg.get(f.name)
        if value is None:
            continue
        if f.array:
            if isinstance(value, (str, bytes, Mapping)):
                raise TypeError(f"{f.name} must be a sequence")
            buf += bytes((0xA0 | f.tag, 0x80))
            for item in value:  # every array here holds sequences: universal SEQUENCE each
                buf += b"\x30\x80"
                _ber_sequence_content(buf, item, f.type)
                buf += b"\0\0"
            buf += b"\0\0"
        else:
            _ber_element(buf, f.tag, value, f.type, f.name)


def _ber_element(buf: bytearray, tag: int, value: Any, type_name: str, where: str) -> None:
    if type_name in FIELDS:
        buf += bytes((0xA0 | tag, 0x80))
        _ber_sequence_content(buf, value, type_name)
        buf += b"\0\0"
    else:
        _ber_primitive(buf, tag, value, type_name, where)


class _BerDecoder:
    """Schema-driven BER reader over one body. Positions are absolute offsets in ``data``."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def _fail(self, message: str, offset: int) -> ProtocolError:
        return ProtocolError(f"BER control message: {message}", offset=offset)

    def header(self, pos: int, end: int) -> Tuple[int, bool, int, int, Optional[int]]:
        """``(class, constructed, tag, content_start, content_end or None if indefinite)``."""
        data = self.data
        if pos >= end:
            raise self._fail("truncated element", pos)
        ident = data[pos]
        pos += 1
        cls, constructed, tag = ident >> 6, bool(ident & _CONSTRUCTED), ident & 0x1F
        if tag == 0x1F:  # high tag number form: never used by this schema, but skippable
            tag = 0
            for _ in range(5):
                if pos >= end:
                    raise self._fail("truncated tag", pos)
                octet = data[pos]
                pos += 1
                tag = (tag << 7) | (octet & 0x7F)
                if not octet & 0x80:
                    break
            else:
                raise self._fail("tag number too long", pos)
        if pos >= end:
            raise self._fail("truncated length", pos)
        first = data[pos]
        pos += 1
        if first == 0x80:
            if not constructed:
                raise self._fail("indefinite length on a primitive element", pos - 1)
            return cls, constructed, tag, pos, None
        if first < 0x80:
            length = first
        else:
            count = first & 0x7F
            if count > _MAX_LENGTH_OCTETS or pos + count > end:
                raise self._fail("bad long-form length", pos - 1)
            length = int.from_bytes(data[pos:pos + count], "big")
            pos += count
        if length > end - pos:
            raise self._fail(f"length {length} runs past the end", pos)
        return cls, constructed, tag, pos, pos + length

    def at_end_of_contents(self, pos: int, end: int) -> bool:
        return pos + 1 < end and self.data[pos] == 0 and self.data[pos + 1] == 0

    def children(self, start: int, stop: Optional[int], end: int
                 ) -> Generator[Tuple[int, bool, int, int, Optional[int]], None, int]:
        """Yield :meth:`header` of each child of a constructed element whose content starts at
        ``start``; the generator's return value is the position after the element."""
        pos = start
        limit = end if stop is None else stop
        while True:
            if stop is None:
                if self.at_end_of_contents(pos, end):
                    return pos + 2
                if pos >= end:
                    raise self._fail("missing end-of-contents", pos)
            elif pos >= stop:
                return stop
            cls, constructed, tag, cstart, cstop = self.header(pos, limit)
            if cls == 0 and tag == 0 and not constructed:
                raise self._fail("unexpected end-of-contents", pos)
            yield cls, constructed, tag, cstart, cstop
            # The consumer may have ignored the child, so find its end here: one extra walk
            # per schema level, which the schema's small depth keeps linear.
            pos = self.skip_to_end(cstart, cstop, limit)

    def skip_to_end(self, cstart: int, cstop: Optional[int], end: int) -> int:
        """Position after an element whose content starts at ``cstart`` (iterative, bounded)."""
        if cstop is not None:
            return cstop
        depth = 1
        pos = cstart
        while depth:
            if self.at_end_of_contents(pos, end):
                pos += 2
                depth -= 1
                continue
            _, constructed, _, start, stop = self.header(pos, end)
            if stop is None:
                depth += 1
                if depth > _MAX_DEPTH:
                    raise self._fail("elements nested too deeply", pos)
                pos = start
            else:
                pos = stop
        return pos

    def decode_top(self, top: str) -> dict:
        end = len(self.data)
        cls, constructed, tag, start, stop = self.header(0, end)
        if (cls, constructed, tag) != (0, True, _SEQUENCE_TAG):
            raise self._fail("top level is not a SEQUENCE", 0)
        value, after = self.sequence(start, stop, end, top, 1)
        if after != end:
            raise self._fail(f"{end - after} trailing bytes", after)
        return value

    def sequence(self, start: int, stop: Optional[int], end: int, seq: str, depth: int) -> Tuple[dict, int]:
        if depth > _MAX_DEPTH:
            raise self._fail("elements nested too deeply", start)
        by_tag = {f.tag: f for f in FIELDS[seq]}
        found: Dict[int, Any] = {}
        it = self.children(start, stop, end)
        limit = end if stop is None else stop
        while True:
            try:
                cls, constructed, tag, cstart, cstop = next(it)
            except StopIteration as done:
                after = done.value
                break
            f = by_tag.get(tag) if cls == _CONTEXT else None
            if f is None:
                continue  # unknown element: skipped like balber's default options
            if f.name is None:
                found[f.tag] = self.choice(cstart, cstop, limit, f.type, constructed, depth + 1)
            elif f.array:
                found[f.tag] = self.array(cstart, cstop, limit, f, constructed, depth + 1)
            else:
                found[f.tag] = self.value(cstart, cstop, limit, f.type, constructed, depth + 1, f.name)
        out: dict = {}
        for f in FIELDS[seq]:
            if f.tag not in found:
                if f.name is None:
                    raise self._fail(f"{seq}: no {f.type} selection", start)
                continue
            if f.name is None:
                out.update(found[f.tag])
            else:
                out[f.name] = found[f.tag]
        return out, after

    def choice(self, start: int, stop: Optional[int], end: int, choice: str, constructed: bool, depth: int) -> dict:
        if not constructed:
            raise self._fail(f"{choice} is not constructed", start)
        sels = CHOICES[choice]
        result: Optional[dict] = None
        limit = end if stop is None else stop
        for cls, sub_constructed, tag, cstart, cstop in self.children(start, stop, end):
            if cls != _CONTEXT:
                continue
            if tag not in sels:
                raise self._fail(f"unsupported {choice} selection {tag}", cstart)
            if result is not None:
                raise self._fail(f"more than one {choice} selection", cstart)
            name, type_name = sels[tag]
            result = {name: self.value(cstart, cstop, limit, type_name, sub_constructed, depth + 1, name)}
        if result is None:
            raise self._fail(f"empty {choice}", start)
        return result

    def array(self, start: int, stop: Optional[int], end: int, f: Field, constructed: bool, depth: int) -> list:
        if not constructed:
            raise self._fail(f"array {f.name} is not constructed", start)
        limit = end if stop is None else stop
        items = []
        for cls, sub_constructed, tag, cstart, cstop in self.children(start, stop, end):
            if (cls, tag) != (0, _SEQUENCE_TAG):
                raise self._fail(f"array {f.name}: element is not a SEQUENCE", cstart)
            items.append(self.value(cstart, cstop, limit, f.type, sub_constructed, depth + 1, f.name or f.type))
        return items

    def value(self, start: int, stop: Optional[int], end: int, type_name: str, constructed: bool,
              depth: int, where: str) -> Any:
        if type_name in FIELDS:
            if not constructed:
                raise self._fail(f"{where} is not constructed", start)
            return self.sequence(start, stop, end, type_name, depth)[0]
        if constructed or stop is None:
            raise self._fail(f"{where} must be primitive", start)
        content = self.data[start:stop]
        if type_name == "string":
            return content.decode("utf-8", "surrogateescape")
        if type_name == "base64Binary":
            return content
        if type_name == "boolean":
            if len(content) != 1:
                raise self._fail(f"{where}: boolean of {len(content)} octets", start)
            return content != b"\x00"
        if not 1 <= len(content) <= 9:
            raise self._fail(f"{where}: integer of {len(content)} octets", start)
        number = int.from_bytes(content, "big", signed=True)
        if type_name in ENUMS:
            name = ENUM_BY_VALUE[type_name].get(number)
            if name is None:
                raise self._fail(f"{where}: {number} is not a {type_name}", start)
            return name
        low, high = INT_RANGES[type_name]
        if not low <= number <= high:
            raise self._fail(f"{where}: {number} out of range for {type_name}", start)
        return number
