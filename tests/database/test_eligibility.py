"""What moves duty.eligible_since and job.scheduled_since (migrations 0017 and 0019): every
change that can make something newly owed, and nothing else; a value set on purpose stays.
The rule is the triggers' WHEN clauses, so each change is tried one by one, as an UPDATE
any statement could send."""

from datetime import date, datetime, timezone

import pytest
from sqlalchemy import text

from tests.helpers import add_duty

EARLY = "2000-01-01T00:00:00Z"
EARLY_INSTANT = datetime(2000, 1, 1, tzinfo=timezone.utc)
ON_PURPOSE = "2001-01-01T00:00:00Z"  # None below: an owner backdating the column; it stays

DUTY_CHANGES = [
    ("state = 'active'", {"state": "paused"}, True),
    ("state = 'paused'", {}, False),
    ("state = 'archived'", {}, False),
    ("frequency = 'weekly'", {}, True),
    ("kind = 'standing', frequency = NULL", {}, True),
    ("timezone = 'Asia/Tokyo'", {}, True),
    ("lead_days = lead_days + 1", {}, True),
    ("lead_days = 0", {"lead_days": 5}, False),
    ("effective_from = NULL", {"effective_from": date(2026, 6, 1)}, True),
    ("effective_from = '2026-01-01'", {"effective_from": date(2026, 6, 1)}, True),
    ("effective_from = '2026-07-01'", {"effective_from": date(2026, 6, 1)}, False),
    ("effective_from = '2026-07-01'", {}, False),
    ("effective_to = NULL", {"effective_to": date(2026, 6, 1)}, True),
    ("effective_to = '2026-07-01'", {"effective_to": date(2026, 6, 1)}, True),
    ("effective_to = '2026-05-01'", {"effective_to": date(2026, 6, 1)}, False),
    ("effective_to = '2026-05-01'", {}, False),
    ("title = 'renamed', updated_at = now()", {}, False),
    ("last_dispatched_period = '2026-12-06', complete_from = '2026-12-06', complete_through = '2026-12-06'", {},
     False),
    (f"eligible_since = '{ON_PURPOSE}', state = 'active'", {"state": "paused"}, None),
]


@pytest.mark.parametrize("change, start, moves", DUTY_CHANGES, ids=[c for c, _, _ in DUTY_CHANGES])
def test_a_duty_is_owed_anew_exactly_when_a_change_can_make_it_owe_more(engine, change, start, moves):
    duty_id = add_duty(engine, frequency="daily", timezone="UTC", **start)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE duty SET eligible_since = '{EARLY}' WHERE id = :id"), {"id": duty_id})
    with engine.begin() as conn:
        started = conn.execute(text("SELECT now()")).scalar_one()
        conn.execute(text(f"UPDATE duty SET {change} WHERE id = :id"), {"id": duty_id})
        since = conn.execute(text("SELECT eligible_since FROM duty WHERE id = :id"), {"id": duty_id}).scalar_one()
    assert since == _expected(moves, started)


def _expected(moves: bool | None, started: datetime) -> datetime:
    if moves is None:
        return datetime(2001, 1, 1, tzinfo=timezone.utc)
    return started if moves else EARLY_INSTANT


JOB_CHANGES = [
    ("enabled = true", False, True),
    ("enabled = false", True, False),
    ("schedule = '*/5 * * * *'", True, True),
    ("timezone = 'Asia/Tokyo'", True, True),
    ("max_attempts = 2", True, False),
    (f"scheduled_since = '{ON_PURPOSE}', schedule = '*/5 * * * *'", True, None),
]


@pytest.mark.parametrize("change, enabled, moves", JOB_CHANGES, ids=[c for c, _, _ in JOB_CHANGES])
def test_a_job_is_scheduled_anew_exactly_when_its_fire_times_can_change(engine, change, enabled, moves):
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO job (name, schedule, timezone, enabled, scheduled_since) "
                          f"VALUES ('j', '0 * * * *', 'UTC', :enabled, '{EARLY}')"), {"enabled": enabled})
    with engine.begin() as conn:
        started = conn.execute(text("SELECT now()")).scalar_one()
        conn.execute(text(f"UPDATE job SET {change} WHERE name = 'j'"))
        since = conn.execute(text("SELECT scheduled_since FROM job WHERE name = 'j'")).scalar_one()
    assert since == _expected(moves, started)
