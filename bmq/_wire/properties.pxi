# Message properties area (§6): old (value length) and new/EX (name offset) encodings.

cdef enum:
    C_PROPS_HEADER_SIZE = 6
    C_PROP_HEADER_SIZE = 6
    C_MAX_PROPERTIES = 255
    C_MAX_NAME_LENGTH = 4095
    C_MAX_VALUE_LENGTH = 67104745
    # Unpadded area cap (C++ MessageProperties); padded it stays within 2^24-1 words.
    C_MAX_AREA_UNPADDED = 67108856

# Fixed value sizes by property type; 0 = variable (STRING, BINARY), -1 = invalid type.
cdef int[8] FIXED_SIZE = [-1, 1, 1, 2, 4, 8, 0, 0]
cdef dict INT_TYPES = {3: (2, -(1 << 15), (1 << 15) - 1), 4: (4, -(1 << 31), (1 << 31) - 1),
                       5: (8, -(1 << 63), (1 << 63) - 1)}


cdef bytes _property_value(str name, int ptype, object value):
    """The wire bytes of one property value, validated against its type."""
    if ptype == C_PROPERTY_BOOL:
        if not isinstance(value, bool):
            raise PropertyError(f"property {name!r}: BOOL needs a bool, got {type(value).__name__}", name)
        return b"\x01" if value else b"\x00"
    if ptype == C_PROPERTY_CHAR:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -128 <= value <= 127:
                raise PropertyError(f"property {name!r}: CHAR {value} outside -128..127", name)
            return (<int>value & 0xFF).to_bytes(1, "big")
        if isinstance(value, (bytes, bytearray, memoryview)) and len(value) == 1:
            return bytes(value)
        raise PropertyError(f"property {name!r}: CHAR needs 1 byte or an int -128..127", name)
    if ptype in INT_TYPES:
        size, low, high = INT_TYPES[ptype]
        if not isinstance(value, int) or isinstance(value, bool):
            raise PropertyError(f"property {name!r}: integer type needs an int, got {type(value).__name__}", name)
        if not low <= value <= high:
            raise PropertyError(f"property {name!r}: {value} outside {low}..{high}", name)
        return (<object>value).to_bytes(size, "big", signed=True)
    if ptype == C_PROPERTY_STRING:
        if not isinstance(value, str):
            raise PropertyError(f"property {name!r}: STRING needs a str, got {type(value).__name__}", name)
        try:
            # Strict: a lone surrogate would go out as invalid UTF-8, which other clients drop.
            return (<str>value).encode("utf-8")
        except UnicodeEncodeError as e:
            raise PropertyError(f"property {name!r}: value is not valid UTF-8 text ({e.reason} at {e.start})",
                                name) from e
    if ptype == C_PROPERTY_BINARY:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise PropertyError(f"property {name!r}: BINARY needs bytes, got {type(value).__name__}", name)
        return bytes(value)
    raise PropertyError(f"property {name!r}: unknown property type {ptype!r}", name)


def encode_properties(properties, bint new_style=True):
    """The padded properties area for ``{name: (PROPERTY_*, value)}`` in insertion order.

    Args:
        properties: mapping of property name to ``(PROPERTY_* type, value)``.
        new_style: MESSAGE_PROPERTIES_EX (offset) encoding, else the old (length) one.

    Returns:
        The area, word aligned, ready to pass to :func:`build_put_events`.

    Raises:
        PropertyError: naming the property, for an empty/too-long name, a value of the wrong
            type or range, an oversized value or area, more than 255 properties, or an
            empty mapping.
    """
    cdef list names = []
    cdef list types = []
    cdef list values = []
    cdef Py_ssize_t count, i, unpadded, offset, field
    cdef bytes out, nb, vb
    cdef unsigned char *p
    cdef unsigned char *h
    cdef unsigned char *data
    if not properties:
        raise PropertyError("a properties area needs at least one property")
    unpadded = C_PROPS_HEADER_SIZE
    for name, spec in properties.items():
        if not isinstance(name, str):
            raise PropertyError(f"property name {name!r} is not a str", None)
        if len(names) == C_MAX_PROPERTIES:
            raise PropertyError(f"property {name!r}: more than {C_MAX_PROPERTIES} properties", name)
        try:
            nb = (<str>name).encode("utf-8")
        except UnicodeEncodeError as e:
            raise PropertyError(f"property name {name!r} is not valid UTF-8 text ({e.reason} at {e.start})",
                                name) from e
        if not 1 <= len(nb) <= C_MAX_NAME_LENGTH:
            raise PropertyError(f"property {name!r}: name length {len(nb)} outside 1..{C_MAX_NAME_LENGTH}", name)
        if not isinstance(spec, tuple) or len(spec) != 2:
            raise PropertyError(f"property {name!r}: expected a (type, value) tuple", name)
        ptype, value = spec
        if not isinstance(ptype, int) or not 1 <= ptype <= 7:
            raise PropertyError(f"property {name!r}: unknown property type {ptype!r}", name)
        vb = _property_value(name, ptype, value)
        if len(vb) > C_MAX_VALUE_LENGTH:
            raise PropertyError(f"property {name!r}: value of {len(vb)} bytes > {C_MAX_VALUE_LENGTH}", name)
        unpadded += C_PROP_HEADER_SIZE + len(nb) + len(vb)
        if unpadded > C_MAX_AREA_UNPADDED:
            raise PropertyError(f"property {name!r}: properties area exceeds {C_MAX_AREA_UNPADDED} bytes", name)
        names.append(nb)
        types.append(ptype)
        values.append(vb)
    count = len(names)
    out = new_bytes(unpadded + pad_len(unpadded))
    p = <unsigned char *>PyBytes_AS_STRING(out)
    field = (unpadded + pad_len(unpadded)) // 4
    p[0] = (3 << 3) | 3
    p[1] = <unsigned char>(field >> 16)
    bmq_store_be16(p + 2, <uint16_t>(field & 0xFFFF))
    p[4] = 0
    p[5] = <unsigned char>count
    h = p + C_PROPS_HEADER_SIZE
    offset = 0
    data = p + C_PROPS_HEADER_SIZE + count * C_PROP_HEADER_SIZE
    for i in range(count):
        nb = names[i]
        vb = values[i]
        field = offset if new_style else len(vb)
        bmq_store_be16(h, <uint16_t>((<int>types[i] << 10) | (field >> 16)))
        bmq_store_be16(h + 2, <uint16_t>(field & 0xFFFF))
        bmq_store_be16(h + 4, <uint16_t>len(nb))
        h += C_PROP_HEADER_SIZE
        memcpy(data + offset, PyBytes_AS_STRING(nb), len(nb))
        offset += len(nb)
        memcpy(data + offset, PyBytes_AS_STRING(vb), len(vb))
        offset += len(vb)
    write_padding(p, unpadded)
    return out


cdef Py_ssize_t area_size(Reader *r, const unsigned char *p, Py_ssize_t n, Py_ssize_t offset) except -1:
    """Padded size (4*MPAW) of the properties area at ``p``, checked against ``n``."""
    cdef Py_ssize_t size
    if n < C_PROPS_HEADER_SIZE:
        _protocol_error(f"properties header needs 6 bytes, {n} left", r.event_type, offset)
    size = 4 * ((<Py_ssize_t>p[1] << 16) | bmq_load_be16(p + 2))
    if size < 8 or size > n:
        _protocol_error(f"properties area of {size} bytes with {n} available", r.event_type, offset)
    return size


cdef object _decode_value(int ptype, const unsigned char *v, Py_ssize_t n):
    if ptype == C_PROPERTY_BOOL:
        return v[0] != 0
    if ptype == C_PROPERTY_CHAR:
        return PyBytes_FromStringAndSize(<const char *>v, 1)
    if ptype == C_PROPERTY_SHORT:
        return <int16_t>bmq_load_be16(v)
    if ptype == C_PROPERTY_INT32:
        return <int32_t>bmq_load_be32(v)
    if ptype == C_PROPERTY_INT64:
        return <int64_t>bmq_load_be64(v)
    if ptype == C_PROPERTY_STRING:
        return (<const char *>v)[:n].decode("utf-8", "surrogateescape")
    return PyBytes_FromStringAndSize(<const char *>v, n)


def decode_properties(area, bint new_style):
    """Inverse of :func:`encode_properties`: ``{name: (PROPERTY_*, value)}`` in wire order.

    ``area`` may have trailing bytes after the padded area (MPAW decides). STRING values
    decode as ``str`` (UTF-8, ``surrogateescape``), CHAR as ``bytes`` of length 1.

    Raises:
        ProtocolError: any truncated, oversized or inconsistent field.
    """
    cdef Input inp
    cdef Reader r
    in_acquire(&inp, area)
    try:
        r.base = inp.data
        r.pos = 0
        r.end = inp.size
        r.event_type = 0
        return decode_area(&r, new_style)
    finally:
        in_release(&inp)


cdef dict decode_area(Reader *r, bint new_style):
    """Decode the area starting at ``r.pos`` (offsets in errors are relative to ``r.base``)."""
    cdef const unsigned char *p = r.base + r.pos
    cdef Py_ssize_t start = r.pos
    cdef Py_ssize_t size, unpadded, hs, phs, count, data_start, i, field, next_field
    cdef Py_ssize_t name_len, value_len, cursor, name_at
    cdef int ptype
    cdef const unsigned char *h
    cdef dict out = {}
    size = area_size(r, p, r.end - r.pos, start)
    unpadded = unpadded_len(r, p, size, start)
    hs = (p[0] & 7) * 2
    phs = ((p[0] >> 3) & 7) * 2
    count = p[5]
    if hs < C_PROPS_HEADER_SIZE or phs < C_PROP_HEADER_SIZE:
        _protocol_error(f"properties header sizes {hs}/{phs} below 6", r.event_type, start)
    if count == 0:
        _protocol_error("properties area with 0 properties", r.event_type, start + 5)
    data_start = hs + count * phs
    if data_start > unpadded:
        _protocol_error(f"{count} property headers overrun the area", r.event_type, start)
    cursor = data_start
    for i in range(count):
        h = p + hs + i * phs
        ptype = (bmq_load_be16(h) >> 10) & 0x1F
        field = ((<Py_ssize_t>bmq_load_be16(h) & 0x3FF) << 16) | bmq_load_be16(h + 2)
        name_len = bmq_load_be16(h + 4) & 0xFFF
        if ptype < 1 or ptype > 7:
            _protocol_error(f"property {i}: invalid type {ptype}", r.event_type, start + hs + i * phs)
        if name_len == 0:
            _protocol_error(f"property {i}: empty name", r.event_type, start + hs + i * phs)
        if new_style:
            name_at = data_start + field
            if name_at != cursor:
                _protocol_error(f"property {i}: name offset {field} is not contiguous",
                                r.event_type, start + hs + i * phs)
            if i + 1 < count:
                next_field = ((<Py_ssize_t>bmq_load_be16(h + phs) & 0x3FF) << 16) | bmq_load_be16(h + phs + 2)
                value_len = next_field - field - name_len
            else:
                value_len = unpadded - name_at - name_len
        else:
            name_at = cursor
            value_len = field
        if value_len < 0 or name_at + name_len + value_len > unpadded:
            _protocol_error(f"property {i}: name/value overrun the area", r.event_type, start + hs + i * phs)
        if FIXED_SIZE[ptype] > 0 and value_len != FIXED_SIZE[ptype]:
            _protocol_error(f"property {i}: type {ptype} with a {value_len}-byte value",
                            r.event_type, start + name_at)
        name = (<const char *>p + name_at)[:name_len].decode("utf-8", "surrogateescape")
        if name in out:
            _protocol_error(f"duplicate property {name!r}", r.event_type, start + name_at)
        out[name] = (ptype, _decode_value(ptype, p + name_at + name_len, value_len))
        cursor = name_at + name_len + value_len
    r.pos = start + size
    return out
