#!/usr/bin/env python3
"""Writes test/data/fixture.tfrecord, the TFRecord file test/test_tfrecord.c reads
back: five records framed by hand (uint64 LE length, masked CRC32C of the length
bytes, data, masked CRC32C of the data) with this script's own CRC32C, so the
C reader is checked against an independent writer. Run from anywhere:
    python3 test/data/make_fixtures.py
"""
import os
import struct


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked(length)) + data + struct.pack("<I", masked(data))


# The same records as fixture_records() in test/test_tfrecord.c.
RECORDS = [
    b"",
    b"a",
    b"hello, tfrecord",
    bytes(range(256)),
    bytes((i * 7 + 3) & 0xFF for i in range(1000)),
]


def main():
    assert crc32c(b"123456789") == 0xE3069283
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixture.tfrecord")
    with open(path, "wb") as f:
        for r in RECORDS:
            f.write(frame(r))
    print(f"wrote {path}: {len(RECORDS)} records, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
