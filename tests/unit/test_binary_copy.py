"""binary_copy's hand-packed rows read back as PostgreSQL's binary COPY format defines
them: a header, per row a field count and each field's length and bytes, a trailer. The
database tier proves the server takes them; this proves each field sits where it is named,
and that a duty without a workspace read from the database cannot be written."""

import struct
import uuid
from datetime import date

import pytest

from rota.pipelines.dispatch.binary_copy import encode_slices, encode_tasks
from rota.pipelines.dispatch.planner import PeriodRow, Plan, Slice

HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
EPOCH = date(2000, 1, 1).toordinal()


def rows(data: bytes) -> list[list[bytes]]:
    assert data.startswith(HEADER) and data.endswith(b"\xff\xff")
    body, found = data[len(HEADER):-2], []
    while body:
        (count,), body = struct.unpack(">h", body[:2]), body[2:]
        fields = []
        for _ in range(count):
            (length,), body = struct.unpack(">i", body[:4]), body[4:]
            fields.append(body[:length])
            body = body[length:]
        found.append(fields)
    return found


def day(field: bytes) -> date:
    return date.fromordinal(struct.unpack(">i", field)[0] + EPOCH)


WORKSPACE = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")


def test_a_slice_is_its_six_fields_in_offered_duty_order():
    [fields] = rows(encode_slices([Slice(42, 3, 1, 7, 9001, WORKSPACE.bytes)]))
    assert [struct.unpack(">q", fields[0])[0], *(struct.unpack(">i", f)[0] for f in fields[1:4]),
            struct.unpack(">q", fields[4])[0], uuid.UUID(bytes=fields[5])] == [42, 3, 1, 7, 9001, WORKSPACE]


def test_a_task_is_its_duty_then_its_period_in_copy_tasks_order():
    periods = (PeriodRow("2026-11", date(2026, 11, 1), date(2026, 11, 30), date(2026, 11, 27)),
               PeriodRow("2026-12", date(2026, 12, 1), date(2026, 12, 31), date(2026, 12, 28)))
    page_plan = Plan(groups=[periods], slices=[Slice(7, 0, 0, 1, 0, WORKSPACE.bytes), Slice(8, 0, 1, 1, 0,
                                                                                                 bytes(16))])
    decoded = [(struct.unpack(">q", f[0])[0], uuid.UUID(bytes=f[1]), f[2].decode(), day(f[3]), day(f[4]), day(f[5]))
               for f in rows(encode_tasks(page_plan, {0: (0, 1)}))]
    assert decoded == [(7, WORKSPACE, *periods[0]), (7, WORKSPACE, *periods[1]), (8, uuid.UUID(int=0), *periods[1])]


def test_a_duty_with_no_workspace_read_cannot_be_encoded():
    with pytest.raises(struct.error):
        encode_slices([Slice(42, 0, 0, 0, 0)])
    with pytest.raises(TypeError):
        encode_tasks(Plan(groups=[(PeriodRow("2026-12", date(2026, 12, 1), date(2026, 12, 31), date(2026, 12, 31)),)],
                          slices=[Slice(42, 0, 0, 0, 0)]), {0: (0, 0)})
