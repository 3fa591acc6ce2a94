"""Reading binary nets written by NVIDIA's Caffe fork (NVCaffe 0.17).

NVCaffe numbers LayerParameter's ``forward_type``, ``backward_type``, ``forward_math`` and
``backward_math`` 145-148, where BVLC (and so this schema) has ``parameter_param``,
``recurrent_param``, ``swish_param`` and ``clip_param``. Ours live at 9700-9703
(docs/precision.md). On the wire the two cannot be confused: NVCaffe's are enum varints (wire type
0), BVLC's are messages (wire type 2). protobuf keeps a field whose wire type does not match the
schema as an unknown field, so without help an NVCaffe layer's types would be silently lost;
:func:`move_layer_types` rewrites those varints onto our numbers before the bytes are parsed.
"""

from __future__ import annotations

#: NVCaffe's LayerParameter number -> ours, for the four precision fields.
LAYER_TYPE_FIELDS: dict[int, int] = {145: 9700, 146: 9701, 147: 9702, 148: 9703}

_NET_LAYER = 100  # NetParameter.layer
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


class _Malformed(Exception):
    """The bytes do not scan as protobuf; the caller leaves them to the real parser."""


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``buf[pos:]`` and the position after it."""
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def encode_varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(buf: memoryview, start: int, end: int):
    """Yield (number, wire type, field start, payload start, field end) of each field in
    ``buf[start:end]``, a message's encoding (no group support: Caffe's schema has no groups)."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        payload = pos
        if wire == _VARINT:
            _, pos = _varint(buf, pos, end)
        elif wire == _FIXED64:
            pos += 8
        elif wire == _FIXED32:
            pos += 4
        elif wire == _BYTES:
            length, payload = _varint(buf, pos, end)
            pos = payload + length
        else:
            raise _Malformed
        if pos > end or number == 0:
            raise _Malformed
        yield number, wire, field_start, payload, pos


def _layer_rewrite(buf: memoryview, start: int, end: int) -> bytes | None:
    """A LayerParameter's bytes with NVCaffe's 145-148 varints renumbered, or None if it has none."""
    pieces: list[bytes] = []
    last = start
    for number, wire, field_start, payload, field_end in _fields(buf, start, end):
        ours = LAYER_TYPE_FIELDS.get(number)
        if ours is None or wire != _VARINT:
            continue
        pieces.append(bytes(buf[last:field_start]))
        pieces.append(encode_varint(ours << 3 | _VARINT))
        pieces.append(bytes(buf[payload:field_end]))
        last = field_end
    if not pieces:
        return None
    pieces.append(bytes(buf[last:end]))
    return b"".join(pieces)


def move_layer_types(data: bytes) -> bytes:
    """A binary NetParameter ``data`` with each layer's NVCaffe ``forward_type``/``backward_type``/
    ``forward_math``/``backward_math`` (fields 145-148 as varints) moved to this schema's numbers.

    Returns ``data`` itself (no copy) when no layer carries them, and also when the bytes do not
    scan as a message: protobuf's parser then reports what is wrong with them. BVLC's fields on
    those numbers are length-delimited and stay where they are."""
    buf = memoryview(data)
    end = len(buf)
    out: list[bytes] = []
    last = 0
    try:
        for number, wire, field_start, payload, field_end in _fields(buf, 0, end):
            if number != _NET_LAYER or wire != _BYTES:
                continue
            layer = _layer_rewrite(buf, payload, field_end)
            if layer is None:
                continue
            out.append(bytes(buf[last:field_start]))
            out.append(encode_varint(_NET_LAYER << 3 | _BYTES))
            out.append(encode_varint(len(layer)))
            out.append(layer)
            last = field_end
    except _Malformed:
        return data
    if not out:
        return data
    out.append(bytes(buf[last:end]))
    return b"".join(out)
