# CONTROL / AUTHENTICATION event envelope (§8.1): header + encoded body + padding.
# The JSON/BER bodies themselves belong to bmq._schema.

def encode_control_event(body, int encoding, int event_type=C_EVENT_CONTROL):
    """EventHeader (encoding in byte 6 bits 7-5) + ``body`` + padding.

    Raises:
        ValueError: unknown encoding or an event type other than CONTROL/AUTHENTICATION.
        MessageTooLargeError: the event would exceed the 31-bit length field.
    """
    cdef Input inp
    cdef Py_ssize_t total
    cdef bytes out
    cdef unsigned char *p
    if encoding != 0 and encoding != 1:
        raise ValueError(f"unknown control encoding {encoding}")
    if event_type != C_EVENT_CONTROL and event_type != C_EVENT_AUTHENTICATION:
        raise ValueError(f"event type {event_type} is not CONTROL or AUTHENTICATION")
    in_acquire(&inp, body)
    try:
        total = C_EVENT_HEADER_SIZE + inp.size + pad_len(inp.size)
        if total > C_MAX_EVENT_LENGTH:
            raise MessageTooLargeError(f"control body of {inp.size} bytes is too large")
        out = new_bytes(total)
        p = <unsigned char *>PyBytes_AS_STRING(out)
        write_event_header(p, event_type, total, encoding << 5)
        memcpy(p + C_EVENT_HEADER_SIZE, inp.data, inp.size)
        write_padding(p + C_EVENT_HEADER_SIZE, inp.size)
        return out
    finally:
        in_release(&inp)


def decode_control_event(event):
    """``(encoding, body)`` of a CONTROL/AUTHENTICATION event, header and padding stripped.

    Raises:
        ProtocolError: bad header, wrong event type, unknown encoding or bad padding.
    """
    cdef Input inp
    cdef Reader r
    cdef int encoding
    cdef Py_ssize_t body_len
    in_acquire(&inp, event)
    try:
        open_event(&r, inp.data, inp.size, 0)
        if r.event_type != C_EVENT_CONTROL and r.event_type != C_EVENT_AUTHENTICATION:
            _protocol_error("not a CONTROL or AUTHENTICATION event", r.event_type, 4)
        encoding = inp.data[6] >> 5
        if encoding > 1:
            _protocol_error(f"unknown control encoding {encoding}", r.event_type, 6)
        body_len = unpadded_len(&r, inp.data + r.pos, r.end - r.pos, r.pos)
        return (encoding, PyBytes_FromStringAndSize(<const char *>inp.data + r.pos, body_len))
    finally:
        in_release(&inp)
