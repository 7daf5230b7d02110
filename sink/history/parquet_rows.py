"""How many rows a Parquet file holds, read from its footer without pyarrow.

The history job's driver learns the rows of every file a micro-batch wrote (the table's manifest
records them: sink/history/manifest.py). Importing pyarrow for that loads pyarrow and NumPy
(80 MB resident), and NumPy loaded makes PySpark's py4j converters load pandas too
(sink/history/spark.py): the idle job's driver held 175 MB instead of about 40 (bench/cold_start.py).
The number is one field of the footer: a Parquet file ends with its FileMetaData (Thrift's compact
protocol), its length (4 bytes, little-endian) and ``PAR1``; ``num_rows`` is the FileMetaData's
field 3, after the version (1) and the schema (2), which are skipped.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

MAGIC = b"PAR1"

# Thrift compact protocol's types
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)


class ParquetFooterError(ValueError):
    """The file is not a Parquet file, or its footer is cut or malformed."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise ParquetFooterError("the Parquet footer ends early")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise ParquetFooterError("a varint in the Parquet footer is too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.data):
            raise ParquetFooterError("the Parquet footer ends early")
        self.pos += n

    def skip(self, ttype: int, depth: int = 0) -> None:
        if depth > 64:
            raise ParquetFooterError("the Parquet footer nests too deep")
        if ttype in (_TRUE, _FALSE):
            return          # a field's boolean is in its header (a list's has a byte: _BYTE below)
        if ttype == _BYTE:
            self.skip_bytes(1)
        elif ttype in (_I16, _I32, _I64):
            self.varint()
        elif ttype == _DOUBLE:
            self.skip_bytes(8)
        elif ttype == _BINARY:
            self.skip_bytes(self.varint())
        elif ttype in (_LIST, _SET):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):
                self.skip(_BYTE if elem in (_TRUE, _FALSE) else elem, depth + 1)
        elif ttype == _MAP:
            size = self.varint()
            if size:
                kv = self.byte()
                for _ in range(size):
                    self.skip(kv >> 4, depth + 1)
                    self.skip(kv & 0x0F, depth + 1)
        elif ttype == _STRUCT:
            last = 0
            while True:
                last, ftype = self.field_header(last)
                if ftype == _STOP:
                    return
                self.skip(ftype, depth + 1)
        else:
            raise ParquetFooterError(f"unknown Thrift type {ttype} in the Parquet footer")

    def field_header(self, last: int) -> tuple[int, int]:
        head = self.byte()
        ftype = head & 0x0F
        if ftype == _STOP:
            return last, _STOP
        delta = head >> 4
        return (last + delta if delta else self.zigzag()), ftype


def footer(path: str | os.PathLike[str]) -> bytes:
    """The Thrift-encoded FileMetaData at the end of a Parquet file."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size < 12:
            raise ParquetFooterError(f"{path}: too short for a Parquet file ({size} bytes)")
        f.seek(size - 8)
        tail = f.read(8)
        length = struct.unpack("<I", tail[:4])[0]
        if tail[4:] != MAGIC or length > size - 12:
            raise ParquetFooterError(f"{path}: not a Parquet file (no footer)")
        f.seek(size - 8 - length)
        return f.read(length)


def parquet_rows(path: str | os.PathLike[str] | Path) -> int:
    """The number of rows of the Parquet file at ``path`` (its footer's num_rows)."""
    r = _Reader(footer(path))
    last = 0
    while True:
        last, ftype = r.field_header(last)
        if ftype == _STOP:
            raise ParquetFooterError(f"{path}: the Parquet footer has no num_rows")
        if last == 3 and ftype == _I64:
            return r.zigzag()
        r.skip(ftype)
