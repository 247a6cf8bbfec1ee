"""A page's rows in PostgreSQL's binary COPY format, encoded directly: its slices, and
the bulk path's tasks."""

import struct
from datetime import date

from rota.pipelines.dispatch.planner import PeriodRow, Plan, Slice

# The bulk path's COPY is written in PostgreSQL's binary COPY format directly: a row is
# its duty's fields followed by its period's, so a duty's tasks are one join of bytes made
# once per duty and once per period. psycopg's write_row formats every field of every row
# instead, a seventh of the dispatcher's Python time (docs/perf.md), with the workspaces
# loaded as UUID objects only to be dumped again.
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature; no flags, no header extension
_COPY_TRAILER = b"\xff\xff"
_DATE_EPOCH = date(2000, 1, 1).toordinal()  # a binary date counts days from it
# A slice: six fields, each its length and value: duty_id int8, period_group, first_index
# and last_index int4, version int8, workspace bytea (16 bytes).
_SLICE = struct.Struct(">hiqiiiiiiiqi16s")


def _period_fields(period: PeriodRow) -> bytes:
    """period_key, period_start, due_date and visible_from of a task row, in binary."""
    key = period.key.encode()
    return struct.pack(f">i{len(key)}siiiiii", len(key), key, 4, period.start.toordinal() - _DATE_EPOCH,
                       4, period.end.toordinal() - _DATE_EPOCH, 4, period.visible_from.toordinal() - _DATE_EPOCH)


def _duty_fields(duty_id: int, workspace: bytes) -> bytes:
    """A task row's field count, duty_id and workspace_id, in binary."""
    return struct.pack(">hiqi", 6, 8, duty_id, 16) + workspace


def encode_slices(slices: list[Slice]) -> bytes:
    """The COPY data of offered_duty: one row per slice, packed at once (psycopg's
    write_row dumps every field of every row on its own, a second a million duties)."""
    pack = _SLICE.pack
    return b"".join([_COPY_HEADER, *[pack(6, 8, s.duty_id, 4, s.group, 4, s.first, 4, s.last, 8, s.version, 16,
                                          s.workspace) for s in slices], _COPY_TRAILER])


def encode_tasks(page_plan: Plan, used: dict[int, tuple[int, int]]) -> bytes:
    """The COPY data of every duty's tasks, in the plan's (identity) order."""
    fields = {group: (first, [_period_fields(period) for period in page_plan.groups[group][first:last + 1]])
              for group, (first, last) in used.items()}
    parts = [_COPY_HEADER]
    for s in page_plan.slices:
        offset, periods = fields[s.group]
        duty = _duty_fields(s.duty_id, s.workspace)
        parts.append(duty + duty.join(periods[s.first - offset:s.last - offset + 1]))
    parts.append(_COPY_TRAILER)
    return b"".join(parts)
