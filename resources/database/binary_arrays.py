"""bigint[] and timestamptz[] parameters packed in PostgreSQL's binary array format by C
loops over whole columns.

psycopg dumps a list element by element in Python (a dumper call and a `struct.pack` per
value): 5 to 7 ms for a producer's 10,000 fire times, paid by eight racing producers at
once on two cores (docs/perf.md, `enqueue_race`). Both types are eight-byte integers on
the wire, a timestamptz being microseconds since 2000-01-01 UTC, so one packing serves
both."""

import struct
import sys
from array import array
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from psycopg import Connection, Cursor, pq
from psycopg.adapt import Dumper
from psycopg.postgres import types

_INT8, _TIMESTAMPTZ = types["int8"], types["timestamptz"]
_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
# datetime's own subtraction, which a subclass (pendulum's) overrides with a slower one
# returning its own interval type.
_since = datetime.__sub__
# Each element on the wire is its length (an int4, always 8) then its 8 bytes.
_ELEMENT = 12


class BigintArray(bytes):
    """A bigint[] parameter, already in PostgreSQL's binary format."""


class TimestamptzArray(bytes):
    """A timestamptz[] parameter, already in PostgreSQL's binary format."""


def microseconds(instants: Sequence[datetime], name: str) -> list[int]:
    """Each instant as PostgreSQL stores a timestamptz. An instant without a UTC offset is
    refused with a ValueError that names it and `name`."""
    try:
        return [_since(at, _EPOCH) // _MICROSECOND for at in instants]
    except TypeError:
        for at in instants:
            if isinstance(at, datetime) and at.tzinfo is None:
                raise ValueError(f"{name} {at.isoformat()} has no UTC offset") from None
        raise


def bigint_array(values: Sequence[int], name: str) -> BigintArray:
    """Refuses a value that is not an int8 with a ValueError that names it and `name`."""
    try:
        return BigintArray(_pack(values, _INT8.oid))
    except (TypeError, OverflowError):
        for value in values:
            if not isinstance(value, int) or not -2**63 <= value < 2**63:
                raise ValueError(f"{name} {value!r} is not a bigint") from None
        raise


def timestamptz_array(micros: Sequence[int]) -> TimestamptzArray:
    """From `microseconds`' values."""
    return TimestamptzArray(_pack(micros, _TIMESTAMPTZ.oid))


def _pack(values: Sequence[int], element_oid: int) -> bytes:
    count = len(values)
    big_endian = array("q", values)
    if sys.byteorder == "little":
        big_endian.byteswap()
    raw = big_endian.tobytes()
    # Lengths and values interleaved by strided slice assignments (C loops): of each
    # length only its last byte is not zero, and byte k of a value lands at 4 + k.
    body = bytearray(_ELEMENT * count)
    body[3::_ELEMENT] = b"\x08" * count
    for k in range(8):
        body[4 + k::_ELEMENT] = raw[k::8]
    # One dimension, no NULLs, the element type, then the dimension's length and lower bound.
    return struct.pack("!iiIii", 1, 0, element_oid, count, 1) + body


class _BigintArrayDumper(Dumper):
    format = pq.Format.BINARY
    oid = _INT8.array_oid

    def dump(self, obj: bytes) -> bytes:
        return obj


class _TimestamptzArrayDumper(_BigintArrayDumper):
    oid = _TIMESTAMPTZ.array_oid


def arrays_cursor(connection: Connection) -> Cursor:
    """A cursor that sends BigintArray and TimestamptzArray parameters as they are (the
    registration is the cursor's own: the connection's adapters stay as they were)."""
    cursor = connection.cursor()
    cursor.adapters.register_dumper(BigintArray, _BigintArrayDumper)
    cursor.adapters.register_dumper(TimestamptzArray, _TimestamptzArrayDumper)
    return cursor
