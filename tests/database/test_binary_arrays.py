"""rota's packing of bigint[] and timestamptz[] parameters against psycopg's own dumping:
the server must read the same values from both, in a session whose TimeZone is not UTC."""

import random
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pendulum
import pytest

from rota.resources.database.binary_arrays import arrays_cursor, bigint_array, microseconds, timestamptz_array

_UNNEST = ("SELECT a, b FROM unnest(%b::bigint[], %b::timestamptz[]) WITH ORDINALITY AS u(a, b, n) "
           "ORDER BY n")
_ZONES = ["UTC", "America/Santiago", "Asia/Kathmandu", "Australia/Lord_Howe", "Pacific/Kiritimati",
          "America/St_Johns", "Europe/Dublin"]


def _instants(rng: random.Random, count: int) -> list[datetime]:
    first, last = datetime(1, 1, 2, tzinfo=timezone.utc), datetime(9999, 12, 30, tzinfo=timezone.utc)
    span = (last - first) // timedelta(microseconds=1)
    instants = [first, last, datetime(2000, 1, 1, tzinfo=timezone.utc),
                datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc),
                pendulum.datetime(2026, 4, 5, 2, 30, tz="America/Santiago"),
                # The fold of a DST fall-back: the same wall time twice, an hour apart.
                datetime(2026, 11, 1, 1, 30, fold=0, tzinfo=ZoneInfo("America/New_York")),
                datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=ZoneInfo("America/New_York"))]
    for _ in range(count):
        at = first + timedelta(microseconds=rng.randrange(span))
        instants.append(at.astimezone(ZoneInfo(rng.choice(_ZONES))) if at.year > 1900 else at)
    return instants


def test_packed_arrays_reach_the_server_as_psycopg_sends_them(engine):
    rng = random.Random(37)
    instants = _instants(rng, 5000)
    ids = [-2**63, 2**63 - 1, 0, -1, 1] + [rng.randrange(-2**63, 2**63) for _ in range(len(instants) - 5)]
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        driver.execute("SET TimeZone = 'Asia/Kathmandu'")
        packed = arrays_cursor(driver).execute(
            _UNNEST, (bigint_array(ids, "id"), timestamptz_array(microseconds(instants, "at")))).fetchall()
        reference = driver.execute(_UNNEST, (ids, instants)).fetchall()
        empty = arrays_cursor(driver).execute(
            "SELECT %b::bigint[]::text, %b::timestamptz[]::text",
            (bigint_array([], "id"), timestamptz_array([]))).fetchone()
    assert len(packed) == len(instants)
    assert packed == reference
    # In UTC: Python never calls an instant equal to one in another zone with fold=1 set.
    assert [at for _, at in packed] == [at.astimezone(timezone.utc) for at in instants]
    assert packed[5][1] + timedelta(hours=1) == packed[6][1]
    assert empty == ("{}", "{}")


def test_bad_values_are_refused_by_name_before_the_server():
    with pytest.raises(ValueError, match=r"^scheduled_for 2026-08-31T21:00:00 has no UTC offset$"):
        microseconds([datetime(2026, 8, 31, 20, tzinfo=timezone.utc), datetime(2026, 8, 31, 21)], "scheduled_for")
    with pytest.raises(TypeError):
        microseconds([datetime(2026, 8, 31, 20).date()], "scheduled_for")
    with pytest.raises(ValueError, match=r"^job_id '7' is not a bigint$"):
        bigint_array([1, "7"], "job_id")
    with pytest.raises(ValueError, match=r"^job_id 9223372036854775808 is not a bigint$"):
        bigint_array([1, 2**63], "job_id")
    with pytest.raises(ValueError, match=r"^job_id None is not a bigint$"):
        bigint_array([None], "job_id")
