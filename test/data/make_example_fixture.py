#!/usr/bin/env python3
"""Writes test/data/example.bin, a serialized tf.train.Example, and seeds for
test/fuzz/corpus/example/, by encoding the protocol buffer by hand (needs
nothing beyond Python). test/test_example.c parses example.bin and compares
with the values below.

    python3 test/data/make_example_fixture.py   (from the repository root)
"""
import os
import struct


def varint(n):
    n &= (1 << 64) - 1  # int64 values are two's complement, 10 bytes when negative
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tag(field, wire):
    return varint(field << 3 | wire)


def ld(field, payload):  # a length-delimited field
    return tag(field, 2) + varint(len(payload)) + payload


def float_list(values, packed=True):
    if packed:
        return ld(1, b"".join(struct.pack("<f", v) for v in values))
    return b"".join(tag(1, 5) + struct.pack("<f", v) for v in values)


def int64_list(values, packed=True):
    if packed:
        return ld(1, b"".join(varint(v) for v in values))
    return b"".join(tag(1, 0) + varint(v) for v in values)


def bytes_list(values):
    return b"".join(ld(1, v) for v in values)


def feature(kind, body):  # kind: 1 bytes_list, 2 float_list, 3 int64_list
    return ld(kind, body)


def entry(key, feat):
    return ld(1, ld(1, key.encode()) + ld(2, feat))


UNKNOWN = (tag(9, 0) + varint(300) + tag(10, 1) + b"\1" * 8 + tag(11, 5) + b"\2" * 4
           + tag(12, 3) + tag(1, 0) + varint(5) + tag(12, 4))


def example():
    entries = [
        entry("floats", feature(2, float_list([1.5, -2.25, 3e10]))),
        entry("floats_unpacked", feature(2, float_list([0.5, 7.0], packed=False) + UNKNOWN)),
        entry("ints", feature(3, int64_list([1, -1, 1 << 62, -(1 << 63)]))),
        entry("ints_unpacked", feature(3, int64_list([42, -7], packed=False))),
        entry("label", feature(3, int64_list([99]))),  # replaced by the later entry
        entry("name", feature(1, bytes_list([b"hello\0world"]))),
        entry("empty", feature(2, b"")),
        entry("two_bytes", feature(1, bytes_list([b"a", b"bc"]))),
        # A repeated list field merges: [1, 2] then [3].
        entry("merged", feature(2, float_list([1.0, 2.0])) + feature(2, float_list([3.0], packed=False))),
        # The oneof's last member wins: int64 [5] replaces the floats.
        entry("switched", feature(2, float_list([8.0])) + feature(3, int64_list([5]))),
    ]
    features_a = b"".join(entries[:5]) + tag(5, 1) + b"\0" * 8
    features_b = b"".join(entries[5:]) + entry("label", feature(3, int64_list([3])))
    # Features split over two fields of Example (they merge), unknown fields around.
    return (tag(7, 0) + varint(123456) + ld(1, features_a) + ld(8, b"ignored")
            + ld(1, features_b))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    data = example()
    with open(os.path.join(here, "example.bin"), "wb") as f:
        f.write(data)
    corpus = os.path.join(here, "..", "fuzz", "corpus", "example")
    os.makedirs(corpus, exist_ok=True)
    seeds = {
        "fixture": data,
        "small": ld(1, entry("label", feature(3, int64_list([7]))) + entry("x", feature(2, float_list([1.0] * 4)))),
        "bytes": ld(1, entry("name", feature(1, bytes_list([b"abc"])))),
        "empty": b"",
        "truncated": data[: len(data) // 2],
    }
    for name, blob in seeds.items():
        with open(os.path.join(corpus, name), "wb") as f:
            f.write(blob)
    try:  # where protobuf is installed, its parser must accept the bytes
        from google.protobuf import empty_pb2
        m = empty_pb2.Empty()
        m.ParseFromString(data)  # every field is unknown to Empty: kept, not refused
    except ImportError:
        pass


if __name__ == "__main__":
    main()
