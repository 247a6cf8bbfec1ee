"""Hostile input (issue 6, case 7): every bad value is refused with an error that names
the field and the row, and nothing else changes; text that only looks dangerous is
stored verbatim and never executed."""

import json
from datetime import date

import pytest
from dagster import DagsterInvariantViolationError
from sqlalchemy import insert, select, text
from sqlalchemy.exc import DBAPIError

from rota.pipelines.periods.partitions import PARTITION_RANGE_END_TAG
from rota.pipelines.queue.cron import InvalidCron
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.producing import produce
from rota.resources.database.schema import duty, job_queue
from tests.helpers import add_duty, database_fingerprint, duty_values, insert_duties, rows_only, task_keys
from tests.dagster.test_dagster import run_asset

HOSTILE_TEXT = [
    "'; DROP TABLE duty; --",
    "Robert'); DELETE FROM task WHERE ('1' = '1",
    "$$ LANGUAGE plpgsql; SELECT pg_sleep(10); $$",
    "%s %(title)s {0} :name \\x00 \\' \" `rm -rf /`",
    "E'\\\\' || current_user || '",
    "\u202e\u200b emoji 🦆 and 中文",
]


@pytest.mark.parametrize("overrides, field", [
    ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
    ({"timezone": "UTC+3"}, "timezone"),
    ({"timezone": "'; DROP TABLE duty; --"}, "timezone"),
    ({"lead_days": 367}, "lead_days"),
    ({"lead_days": -1}, "lead_days"),
    ({"effective_from": date(2026, 9, 1), "effective_to": date(2026, 8, 31)}, "effective_window"),
    ({"kind": "standing", "frequency": "monthly"}, "frequency"),
    ({"kind": "recurring", "frequency": None}, "frequency"),
    ({"frequency": "fortnightly"}, "frequency"),
    ({"state": "deleted"}, "state"),
    ({"title": "x" * 501}, "title"),
    ({"title": ""}, "title"),
])
def test_a_hostile_duty_is_refused_naming_field_and_row_and_its_batch_is_not_half_written(
        engine, overrides, field):
    good = duty_values(title="the good row")
    bad = duty_values(**{"title": "the hostile row", **overrides})
    before = database_fingerprint(engine)
    with pytest.raises(DBAPIError) as refused:
        insert_duties(engine, [good, bad])
    message = str(refused.value.orig)
    assert field in message, message
    # The row: PostgreSQL's DETAIL carries the failing row (its workspace is unique to
    # it), or the key that failed.
    assert str(bad["workspace_id"]) in message or f"({field})=" in message, message
    assert rows_only(database_fingerprint(engine)) == rows_only(before)


def test_a_nul_byte_anywhere_is_refused_before_it_reaches_a_table(engine):
    register_job(engine, "github-issue")
    before = database_fingerprint(engine)
    with pytest.raises(ValueError, match=r"source 'github' ref 'a/b#1\\x00': source_ref contains a NUL"):
        produce(engine, "github", "a/b#1\x00", "github-issue", {})
    with pytest.raises(ValueError, match=r"ref 'a/b#2': payload contains a NUL"):
        produce(engine, "github", "a/b#2", "github-issue", {"title": "nul \x00 inside"})
    with pytest.raises(ValueError, match=r"ref 'a/b#3': payload contains a NUL"):
        produce(engine, "github", "a/b#3", "github-issue", {"key\x00": 1})
    with pytest.raises(ValueError, match=r"job 'bad\\x00name': name contains a NUL"):
        register_job(engine, "bad\x00name")
    with pytest.raises(Exception, match="NUL"):  # a duty written by hand: psycopg refuses it
        add_duty(engine, title="nul \x00 title")
    assert database_fingerprint(engine) == before


def test_oversized_refs_and_names_are_refused_by_name(engine):
    register_job(engine, "github-issue")
    before = database_fingerprint(engine)
    with pytest.raises(ValueError, match=r"source_ref must be 1 to 1000 characters, not 5000"):
        produce(engine, "github", "r" * 5000, "github-issue", {})
    with pytest.raises(ValueError, match=r"source_ref must be 1 to 1000 characters, not 0"):
        produce(engine, "github", "", "github-issue", {})
    with pytest.raises(ValueError, match=r"name must be 1 to 200 characters, not 201"):
        register_job(engine, "j" * 201)
    assert database_fingerprint(engine) == before
    job_id = register_job(engine, "by-hand")
    with pytest.raises(DBAPIError, match="job_queue_source_ref_length"):  # the constraint behind the check
        with engine.begin() as conn:
            conn.execute(insert(job_queue).values(job_id=job_id, source="github", source_ref="r" * 1001))


@pytest.mark.parametrize("schedule", ["* * * *", "61 * * * *", "* * * * * *", "@every 5m", "'; DROP TABLE job; --"])
def test_an_invalid_cron_is_refused_naming_the_job(engine, schedule):
    before = database_fingerprint(engine)
    with pytest.raises(InvalidCron, match=r"job 'nightly-report': cron"):
        register_job(engine, "nightly-report", schedule=schedule)
    assert database_fingerprint(engine) == before


def test_sql_metacharacters_are_stored_verbatim_and_never_executed(engine):
    job_id = register_job(engine, "github-issue")
    ids = insert_duties(engine, [duty_values(title=value) for value in HOSTILE_TEXT])
    for n, value in enumerate(HOSTILE_TEXT):
        assert produce(engine, value, f"{value}#{n}", "github-issue", {value: value, "nested": [value]}) == "created"
    with engine.connect() as conn:
        titles = conn.execute(select(duty.c.title).where(duty.c.id.in_(ids)).order_by(duty.c.id)).scalars().all()
        runs = conn.execute(select(job_queue.c.source, job_queue.c.source_ref, job_queue.c.payload)
                            .where(job_queue.c.job_id == job_id).order_by(job_queue.c.id)).all()
        tables = set(conn.execute(text("SELECT relname FROM pg_class WHERE relkind IN ('r', 'p') "
                                       "AND relnamespace = 'public'::regnamespace")).scalars())
    assert titles == HOSTILE_TEXT
    assert [(s, r, json.dumps(p, sort_keys=True)) for s, r, p in runs] == [
        (v, f"{v}#{n}", json.dumps({v: v, "nested": [v]}, sort_keys=True)) for n, v in enumerate(HOSTILE_TEXT)]
    assert {"duty", "task", "job", "job_queue", "event"} <= tables


@pytest.mark.parametrize("as_of, says", [
    ("yesterday", "is not an ISO 8601 instant"),
    ("2026-13-01T00:00:00Z", "is not an ISO 8601 instant"),
    ("'; DROP TABLE task; --", "is not an ISO 8601 instant"),
    ("2026-08-20T00:00:00", "has no UTC offset"),
])
def test_an_as_of_that_is_not_an_instant_fails_the_run_naming_the_field(engine, as_of, says):
    add_duty(engine)
    before = database_fingerprint(engine)
    result = run_asset("monthly_tasks", "2026-08-01", "2026-08-01", as_of=as_of, raise_on_error=False)
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error
    assert f"as_of {as_of!r} {says}" in error.message + str(error.cause)
    assert database_fingerprint(engine) == before


def test_a_backfill_with_only_an_end_is_refused_and_writes_nothing(engine):
    from dagster import DagsterInstance, materialize

    from rota.pipelines.definitions import defs

    add_duty(engine)
    before = database_fingerprint(engine)
    with pytest.raises(DagsterInvariantViolationError, match="range_end set without the other"):
        materialize([defs.resolve_assets_def("monthly_tasks")], instance=DagsterInstance.ephemeral(),
                    tags={PARTITION_RANGE_END_TAG: "2026-08-01"}, raise_on_error=False)
    assert task_keys(engine) == []
    assert database_fingerprint(engine) == before
