"""Building hostile trace files for the tests: chunks with valid checksums
around JSON that is not what kdebug writes (docs/trace-format.md)."""
from __future__ import annotations

import copy
import json
import random
import struct
import zlib

HEADER = 32
META, END = 3, 4


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """1 to 4 bit flips, deletions or insertions at random places; one mutant
    in 8 also cut short, as by a process that died (read up to the cut)."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(b))
        op = rng.randrange(3)
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            del b[i]
        else:
            b.insert(i, rng.randrange(256))
    if rng.randrange(8) == 0:
        del b[rng.randrange(32, len(b)):]
    return bytes(b)


def chunks(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, type, body length) of each whole chunk of a trace."""
    out, pos = [], HEADER
    while pos + 16 <= len(data):
        magic, typ, n, _ = struct.unpack_from("<4sIII", data, pos)
        assert magic == b"KDCK"
        out.append((pos, typ, n))
        pos += 16 + n
    return out


def chunk(typ: int, body: bytes) -> bytes:
    return struct.pack("<4sIII", b"KDCK", typ, len(body), zlib.crc32(body)) + body


def with_meta(data: bytes, meta) -> bytes:
    """The trace with one more META chunk (a dict as JSON, or raw text) just
    before its END chunk: its keys override every earlier META's."""
    body = (meta if isinstance(meta, str) else json.dumps(meta)).encode("utf-8", "surrogatepass")
    end = chunks(data)[-1]
    assert end[1] == END
    return data[:end[0]] + chunk(META, body) + data[end[0]:]


# values a hostile META could hold in place of any of kdebug's
HOSTILE_VALUES = [None, [], {}, [1, 2], "x", "", -1, 2 ** 64, 1.5, float("inf"), True, {"a": None},
                  "<img src=x onerror=alert(1)>", [None], {"1": []}]


def _value(rng: random.Random):
    return copy.deepcopy(rng.choice(HOSTILE_VALUES))  # a fresh one: never a container already placed


def hostile_meta(rng: random.Random, base: dict) -> str:
    """A structure-aware META mutation: one or more of the keys kdebug reads
    (or a nested one) replaced by a hostile value, or a hostile document."""
    k = rng.randrange(10)
    if k == 0:  # not an object at all
        return rng.choice(["null", "[]", "[1]", '"meta"', "1", "true", "[" * 100000 + "]" * 100000,
                           '{"a":' * 50000 + "1" + "}" * 50000, "NaN", '{"time": Infinity}', "{", "\udcff"])
    d = json.loads(json.dumps(base))
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(list(d) + ["stats", "hash_specs", "argv", "custom_hashes_not_saved", "unknown",
                                    "kernel_provenance", "kernel_code", "kernel_code_dropped"])
        v = d.get(key)
        if isinstance(v, dict) and v and rng.randrange(2):
            sub = rng.choice(list(v))
            if isinstance(v[sub], dict) and v[sub] and rng.randrange(2):
                v[sub][rng.choice(list(v[sub]))] = _value(rng)
            else:
                v[rng.choice([sub, "<b>" + sub, "0", "99999"])] = _value(rng)
        elif isinstance(v, list) and v and rng.randrange(2):
            v[rng.randrange(len(v))] = _value(rng)
        else:
            d[key] = _value(rng)
    return json.dumps(d)


STRINGS = 1


def _varint(b: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def _enc_varint(v: int) -> bytes:
    out = bytearray()
    while True:
        c, v = v & 0x7F, v >> 7
        out.append(c | (0x80 if v else 0))
        if not v:
            return bytes(out)


def with_strings(data: bytes, fn) -> bytes:
    """The trace with each string of its STRINGS chunks (kernel and op names,
    op texts, argument names, ...) replaced by fn(string id, text), every
    chunk's checksum made right (docs/trace-format.md)."""
    out, sid = bytearray(data[:HEADER]), 1
    for off, typ, n in chunks(data):
        body = data[off + 16:off + 16 + n]
        if typ == STRINGS:
            count, i = _varint(body, 0)
            new = bytearray(_enc_varint(count))
            for _ in range(count):
                size, i = _varint(body, i)
                text = fn(sid, body[i:i + size].decode("utf-8")).encode("utf-8")
                new += _enc_varint(len(text)) + text
                i += size
                sid += 1
            body = bytes(new)
        out += chunk(typ, body)
    return bytes(out)


def extents_tree_bytes(tree) -> bytes:
    """An extents tree (None, lists, tuples, dicts, ints) in the hash-tree
    encoding kdebug writes it in (docs/trace-format.md)."""
    if tree is None:
        return b"\x00"
    if isinstance(tree, bool):
        raise TypeError("no bools in an extents tree")
    if isinstance(tree, int):
        return b"\x04" + struct.pack("<q", tree) if tree < 2 ** 63 else b"\x05" + struct.pack("<Q", tree)
    if isinstance(tree, dict):
        return b"\x03" + _enc_varint(len(tree)) + b"".join(
            _enc_varint(len(k.encode())) + k.encode() + extents_tree_bytes(v) for k, v in tree.items())
    tag = b"\x01" if isinstance(tree, list) else b"\x02"
    return tag + _enc_varint(len(tree)) + b"".join(extents_tree_bytes(v) for v in tree)


def with_body_bytes(data: bytes, at: int, new: bytes) -> bytes:
    """The trace with the bytes at offset ``at`` replaced by ``new`` (as many),
    inside one chunk's body, and that chunk's checksum made right."""
    off, typ, n = next(c for c in chunks(data) if c[0] + 16 <= at and at + len(new) <= c[0] + 16 + c[2])
    out = bytearray(data)
    out[at:at + len(new)] = new
    body = bytes(out[off + 16:off + 16 + n])
    out[off:off + 16 + n] = chunk(typ, body)
    return bytes(out)
