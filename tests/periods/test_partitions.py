"""task in period partitions (migration 0009): made by rota before it writes, never
granted to a tenant, and the rows of an older schema moved whole."""

import threading
import uuid
from datetime import date

import psycopg
import pytest
from alembic import command
from sqlalchemy import create_engine, text

from rota.pipelines.dispatch.planner import Mode, plan
from rota.pipelines.dispatch.reading import read_pages
from rota.pipelines.dispatch.writing import ensure_partitions, write_plan
from rota.pipelines.periods.calendar import parse_instant, period_containing
from rota.resources.database import migrate as migrations
from rota.resources.database.server import driver_url
from tests.helpers import add_duty, task_keys, tenant
from tests.dispatch.test_dispatch import months, run


def _day(day: str):
    return [period_containing("daily", date.fromisoformat(day))]


def _partitions(engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'task'::regclass")).all())


# Keys share partitions: each is named once, with its range and the keys of every frequency that must land in it.
PARTITIONS = {
    "task_2026": (("2026", "2026-01"), ["2026"]),
    "task_2026_08_a": (("2026-08", "2026-08-09"), ["2026-08", "2026-08-01", "2026-08-08"]),
    "task_2026_08_b": (("2026-08-09", "2026-08-17"), ["2026-08-09"]),
    "task_2026_08_c": (("2026-08-17", "2026-08-25"), ["2026-08-24"]),
    "task_2026_08_d": (("2026-08-25", "2026-08~"), ["2026-08-31"]),
    "task_2026_q": (("2026-Q", "2026-R"), ["2026-Q3"]),
    "task_2026_w_1": (("2026-W", "2026-W14"), ["2026-W01", "2026-W13"]),
    "task_2026_w_4": (("2026-W40", "2026-X"), ["2026-W40", "2026-W53"]),
}


@pytest.mark.parametrize("key, name, bounds", [
    (key, name, bounds) for name, (bounds, keys) in PARTITIONS.items() for key in keys
])
def test_every_frequencys_key_has_one_partition_whose_range_holds_it(engine, key, name, bounds):
    with engine.begin() as conn:
        assert conn.execute(text("SELECT rota_ensure_task_partitions(:k)"), {"k": [key]}).scalar_one() == 1
        assert conn.execute(text("SELECT rota_ensure_task_partitions(:k)"), {"k": [key]}).scalar_one() == 0
        found = conn.execute(text("SELECT * FROM rota_task_partition_of(:k)"), {"k": key}).one()
        # The key sorts inside its range byte by byte, whatever the database's collation.
        inside = conn.execute(text('SELECT :lo <= CAST(:k AS text) COLLATE "C" AND CAST(:k AS text) COLLATE "C" < :hi'),
                              {"lo": bounds[0], "k": key, "hi": bounds[1]}).scalar_one()
    assert tuple(found) == (name, *bounds) and inside
    assert _partitions(engine) == {name: f"FOR VALUES FROM ('{bounds[0]}') TO ('{bounds[1]}')"}


@pytest.mark.parametrize("key", ["2026-13", "2026-08-32", "2026-W54", "2026-Q5", "26-08", "2026-08-1", ""])
def test_a_key_no_frequency_makes_is_refused_naming_it(engine, key):
    with pytest.raises(Exception, match=f'period key "{key}" is no frequency'):
        ensure_partitions(engine, ["2026-08", key])
    assert _partitions(engine) == {}  # nothing half-made


def test_the_keys_of_a_year_fill_54_partitions_that_do_not_overlap(engine):
    keys = [f"2026-{m:02d}-{d:02d}" for m in range(1, 13) for d in range(1, 29)]
    keys += [f"2026-{m:02d}" for m in range(1, 13)] + [f"2026-W{w:02d}" for w in range(1, 54)]
    keys += [f"2026-Q{q}" for q in range(1, 5)] + ["2026", "2027-01"]
    ensure_partitions(engine, keys)
    assert len(_partitions(engine)) == 1 + 48 + 1 + 4 + 1


def test_a_night_and_a_backfill_make_the_partitions_they_write_into(engine):
    add_duty(engine, frequency="daily")
    monthly = add_duty(engine, frequency="monthly")
    assert _partitions(engine) == {}
    run(engine, "2026-08-16T12:00:00Z", _day("2026-08-16"), frequency="daily")
    # The night's range, and the period after it, ahead of the next night.
    assert set(_partitions(engine)) == {"task_2026_08_b", "task_2026_08_c"}
    run(engine, "2026-08-31T12:00:00Z", months("2019-11", "2020-02"), mode=Mode.BACKFILL)
    assert set(_partitions(engine)) - {"task_2026_08_b", "task_2026_08_c"} == {
        "task_2019_11_a", "task_2019_12_a", "task_2020_01_a", "task_2020_02_a", "task_2020_03_a"}
    assert task_keys(engine, monthly) == ["2019-11", "2019-12", "2020-01", "2020-02"]


def test_a_page_makes_the_partitions_it_writes_into_on_its_own(engine):
    """Whoever writes a page (here without a run around it) finds its partitions made."""
    duty_id = add_duty(engine, frequency="monthly", lead_days=40)
    page = next(read_pages(engine, "monthly", 100))
    as_of = parse_instant("2026-08-31T12:00:00Z")
    page_plan = plan(page, frequency="monthly", mode=Mode.SCHEDULED, as_of=as_of, requested=months("2026-08", "2026-09"))
    write_plan(engine, page_plan, "monthly")
    assert task_keys(engine, duty_id) == ["2026-08", "2026-09"]
    assert set(_partitions(engine)) == {"task_2026_08_a", "task_2026_09_a"}


def test_writers_racing_to_make_one_partition_all_succeed(database_url, engine):
    keys = ["2031-01-01", "2031-01-09", "2031-W02", "2031"]
    errors, barrier = [], threading.Barrier(8)

    def make():
        racer = create_engine(driver_url(database_url))
        try:
            with racer.begin() as conn:
                barrier.wait()
                conn.execute(text("SELECT rota_ensure_task_partitions(:k)"), {"k": keys})
        except Exception as error:  # noqa: BLE001 - any failure is the finding
            errors.append(error)
        finally:
            racer.dispose()

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and len(_partitions(engine)) == 4


def test_making_a_partition_waits_on_no_vacuum_of_another(engine):
    """Makers lock task alone, as ATTACH does: a partition being vacuumed or analyzed
    (SHARE UPDATE EXCLUSIVE on it, which an anti-wraparound vacuum holds to the end)
    keeps no new partition waiting."""
    ensure_partitions(engine, ["2026-11-24"])
    with engine.connect() as vacuum:
        vacuum.execute(text("LOCK TABLE task_2026_11_c IN SHARE UPDATE EXCLUSIVE MODE"))
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '2s'"))
            assert conn.execute(text("SELECT rota_ensure_task_partitions(ARRAY['2026-12-02'])")).scalar_one() == 1
        vacuum.rollback()


def test_a_tenant_can_neither_make_a_partition_nor_read_one_directly(database_url, engine, workspace):
    duty_id = add_duty(engine, workspace_id=workspace)
    run(engine, "2026-08-31T12:00:00Z", months("2026-08", "2026-08"))
    with tenant(database_url, workspace) as conn:
        assert conn.execute("SELECT duty_id FROM task").fetchall() == [(duty_id,)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table task_2026_08_a"):
            conn.execute("SELECT * FROM task_2026_08_a")
    with tenant(database_url, workspace) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="may not insert tasks"):
            conn.execute("SELECT rota_ensure_task_partitions(ARRAY['2040-01'])")
    with engine.connect() as conn:
        granted = conn.execute(text(
            "SELECT count(*) FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a "
            "WHERE c.relispartition AND a.grantee <> c.relowner")).scalar_one()
    assert granted == 0


def test_the_migration_moves_every_row_and_the_ids_go_on(fresh_database):
    url = fresh_database()
    command.downgrade(migrations.alembic_config(url), "0008")
    engine = create_engine(driver_url(url))
    try:
        workspace = uuid.uuid4()
        # At 0008 duty has no eligible_since: the database is left to fill it at 0017.
        duty_id = add_duty(engine, workspace_id=workspace, frequency="daily", eligible_since=None)
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO task (duty_id, workspace_id, period_key, period_start, due_date, visible_from, status) "
                "SELECT :d, :w, to_char(day, 'YYYY-MM-DD'), day, day, day, 'done' "
                "FROM generate_series(date '2025-12-20', date '2026-01-10', interval '1 day') AS day"),
                {"d": duty_id, "w": workspace})
            before = conn.execute(text("SELECT * FROM task ORDER BY id")).all()
        migrations.upgrade(url)
        with engine.connect() as conn:
            after = conn.execute(text("SELECT * FROM task ORDER BY id")).all()
        assert after == before and len(before) == 22
        assert set(_partitions(engine)) == {"task_2025_12_c", "task_2025_12_d", "task_2026_01_a", "task_2026_01_b"}
        run(engine, "2026-01-11T12:00:00Z", _day("2026-01-11"), frequency="daily")
        with engine.connect() as conn:
            newest = conn.execute(text("SELECT id, period_key FROM task ORDER BY id DESC LIMIT 1")).one()
        assert newest == (before[-1].id + 1, "2026-01-11")
        migrations.check(url)
        command.downgrade(migrations.alembic_config(url), "0008")
        with engine.connect() as conn:
            assert len(conn.execute(text("SELECT * FROM task")).all()) == 23
            assert conn.execute(text("SELECT count(*) FROM pg_inherits")).scalar_one() == 0
    finally:
        engine.dispose()


def test_a_duplicate_is_refused_under_the_identitys_name(engine, workspace):
    duty_id = add_duty(engine, workspace_id=workspace)
    ensure_partitions(engine, ["2026-08"])
    row = {"d": duty_id, "w": workspace, "s": date(2026, 8, 1), "e": date(2026, 8, 31)}
    insert = text("INSERT INTO task (duty_id, workspace_id, period_key, period_start, due_date, visible_from) "
                  "VALUES (:d, :w, '2026-08', :s, :e, :e)")
    with engine.begin() as conn:
        conn.execute(insert, row)
    with pytest.raises(Exception) as refused:
        with engine.begin() as conn:
            conn.execute(insert, row)
    assert refused.value.orig.diag.constraint_name == "task_dispatch_identity_2026_08_a"
