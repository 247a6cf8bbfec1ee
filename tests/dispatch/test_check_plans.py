"""The completeness check's plan when the dispatch has just made the statistics stale."""

import pytest
from sqlalchemy import create_engine, text

from rota.pipelines.dispatch.completeness import find_gaps
from rota.pipelines.dispatch.planner import Mode
from rota.pipelines.dispatch.run import dispatch
from rota.pipelines.periods.calendar import open_range, parse_instant, period_containing, periods_between
from rota.resources.database.server import driver_url
from tests.helpers import duty_values, insert_duties

AS_OF = parse_instant("2027-03-08T12:00:00+00:00")


@pytest.fixture
def patient_engine(database_url):
    """The check as a run makes it, but cut off where a sound plan has long finished
    (a degenerate one took minutes)."""
    engine = create_engine(driver_url(database_url), connect_args={"options": "-c statement_timeout=30s"})
    yield engine
    engine.dispose()


def test_the_check_probes_each_duty_even_where_the_statistics_predate_the_dispatch(engine, patient_engine):
    # Monthly keys share task_2027_03_a with days 1 to 8: analyzed at 80 rows, then filled.
    insert_duties(engine, [duty_values(frequency="monthly", title=f"m {i}") for i in range(80)])
    dispatch(engine, frequency="monthly", mode=Mode.BACKFILL, as_of=AS_OF,
             requested=[period_containing("monthly", AS_OF.date())])
    with engine.begin() as conn:
        partition = conn.execute(text("SELECT name FROM rota_task_partition_of('2027-03-01')")).scalar_one()
        conn.execute(text(f"ALTER TABLE {partition} SET (autovacuum_enabled = off)"))
        conn.execute(text(f"ANALYZE {partition}"))
    daily = insert_duties(engine, [duty_values(frequency="daily", title=f"d {i}") for i in range(15_000)])
    with engine.begin() as conn:
        conn.execute(text("ANALYZE duty"))
    days = periods_between(period_containing("daily", AS_OF.date().replace(day=1)),
                           period_containing("daily", AS_OF.date()))
    report = dispatch(engine, frequency="daily", mode=Mode.BACKFILL, as_of=AS_OF, requested=days)
    assert report.total("created") == 120_000
    with engine.begin() as conn:
        assert conn.execute(text("SELECT reltuples FROM pg_class WHERE relname = :p"),
                            {"p": partition}).scalar() == 80
        conn.execute(text("DELETE FROM task WHERE duty_id = :d AND period_key IN ('2027-03-02', '2027-03-08')"),
                     {"d": daily[-1]})

    backfill = find_gaps(patient_engine, frequency="daily", mode=Mode.BACKFILL, as_of=AS_OF, requested=days)
    scheduled = find_gaps(patient_engine, frequency="daily", mode=Mode.SCHEDULED, as_of=AS_OF,
                          requested=periods_between(*open_range("daily", AS_OF, 0)))

    assert (backfill.count, backfill.first) == (2, [(daily[-1], "2027-03-02"), (daily[-1], "2027-03-08")])
    assert (scheduled.count, scheduled.first) == (1, [(daily[-1], "2027-03-08")])


@pytest.mark.parametrize("mode", [Mode.SCHEDULED, Mode.BACKFILL])
def test_the_check_split_across_connections_finds_what_one_connection_finds(engine, mode):
    """Split by duty id, each part counts its own gaps and shows its first: together the
    same count and the same first twenty as one query over all duties."""
    ids = insert_duties(engine, [duty_values(frequency="daily", timezone=("UTC", "Asia/Tokyo", "America/Denver")[i % 3],
                                             title=f"d {i}") for i in range(300)])
    requested = periods_between(*open_range("daily", AS_OF, 0))
    dispatch(engine, frequency="daily", mode=mode, as_of=AS_OF, requested=requested)
    with engine.begin() as conn:  # gaps scattered over every part, the last duty among them
        conn.execute(text("DELETE FROM task WHERE duty_id = ANY(:ids)"), {"ids": ids[5::7] + [ids[-1]]})
    one = find_gaps(engine, frequency="daily", mode=mode, as_of=AS_OF, requested=requested)
    assert one.count >= 43 and one.first[-1][0] < ids[-1]
    for parallel in (2, 3, 7):
        assert find_gaps(engine, frequency="daily", mode=mode, as_of=AS_OF, requested=requested,
                         parallel=parallel) == one
