"""A year in fast-forward (issue 6, case 6): a thousand duties driven through every
hourly tick of 2026 the way the dispatch schedules' runs drive them, a sample of ticks
through the schedules and Dagster itself, against an expectation written here from
the spec alone (stdlib calendar arithmetic; nothing of rota's periods or planner)."""

import random
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from dagster import DagsterInstance, build_schedule_context, materialize
from sqlalchemy import create_engine, text

from rota.pipelines.dispatch.assets import MODE_TAG
from rota.pipelines.definitions import defs
from rota.pipelines.dispatch.planner import Mode
from rota.pipelines.dispatch.run import dispatch
from rota.pipelines.periods.calendar import open_range, periods_between
from rota.resources.database.engine import DEFAULT_WRITERS
from rota.resources.database.schema import FREQUENCIES
from tests.helpers import duty_values, gaps_after, insert_duties

ZONES = [
    "UTC", "Pacific/Kiritimati", "Pacific/Pago_Pago", "Asia/Kolkata", "Asia/Kathmandu",
    "Australia/Lord_Howe", "Pacific/Chatham", "America/St_Johns", "Europe/London", "America/New_York",
    "Australia/Sydney", "America/Santiago", "Asia/Shanghai", "America/Los_Angeles", "Pacific/Marquesas",
    "Asia/Tehran", "Africa/Casablanca",
]
LEADS = [0, 0, 1, 3, 7, 15, 30, 45, 90, 200, 366]
START = datetime(2026, 1, 1, tzinfo=timezone.utc)
TICKS = [START + timedelta(hours=n) for n in range(365 * 24)]


# ------------------------------------------------------------- the expectation

def period_of(frequency: str, day: date) -> tuple[str, date, date]:
    """(key, first day, last day) of the period containing `day`, from SPEC §3."""
    if frequency == "daily":
        return day.isoformat(), day, day
    if frequency == "weekly":
        year, week, weekday = day.isocalendar()
        start = day - timedelta(days=weekday - 1)
        return f"{year}-W{week:02d}", start, start + timedelta(days=6)
    if frequency == "yearly":
        return str(day.year), date(day.year, 1, 1), date(day.year, 12, 31)
    months = 3 if frequency == "quarterly" else 1
    first_month = (day.month - 1) // months * months + 1
    start = date(day.year, first_month, 1)
    after = date(start.year + (first_month + months - 1) // 12, (first_month + months - 1) % 12 + 1, 1)
    key = f"{day.year}-Q{(day.month - 1) // 3 + 1}" if frequency == "quarterly" else f"{day.year}-{day.month:02d}"
    return key, start, after - timedelta(days=1)


def expected_tasks(duties: list[dict], pauses: dict[int, list[tuple[int, str]]]) -> dict[int, list[str]]:
    """SPEC §4's scheduled run at every tick: the current period and every later one whose
    visible_from has come, inside the windows, never a period at or below the newest."""
    local_days = {zone: [t.astimezone(ZoneInfo(zone)).date() for t in TICKS] for zone in ZONES}
    result = {}
    for d in duties:
        days = local_days[d["timezone"]]
        changes = {0} | {i for i in range(1, len(TICKS)) if days[i] != days[i - 1]}
        changes |= {i for i, _ in pauses.get(d["id"], [])}
        state, events = d["state"], dict(pauses.get(d["id"], []))
        low, high = d["effective_from"] or date.min, d["effective_to"] or date.max
        made: list[str] = []
        for i in sorted(changes):
            state = events.get(i, state)
            today = days[i]
            if state != "active" or not low <= today <= high:
                continue
            key, start, end = period_of(d["frequency"], today)
            candidates = [(key, end)]
            while True:
                key, start, end = period_of(d["frequency"], end + timedelta(days=1))
                if end - timedelta(days=d["lead_days"]) > today:
                    break
                candidates.append((key, end))
            for key, end in candidates:
                if low <= end <= high and (not made or key > made[-1]):
                    made.append(key)
        result[d["id"]] = made
    return result


# ------------------------------------------------------------------ the drive

def duty_mix(rng: random.Random, count: int = 1000) -> list[dict]:
    rows = []
    for n in range(count):
        frequency = FREQUENCIES[n % len(FREQUENCIES)]
        window_from = date(2026, 1, 1) + timedelta(days=rng.randrange(365)) if rng.random() < 0.25 else None
        window_to = date(2026, 1, 1) + timedelta(days=rng.randrange(365)) if rng.random() < 0.25 else None
        if window_from and window_to and window_to < window_from:
            window_from, window_to = window_to, window_from
        rows.append(duty_values(title=f"year duty {n}", frequency=frequency, timezone=rng.choice(ZONES),
                                lead_days=rng.choice(LEADS), effective_from=window_from,
                                effective_to=window_to, state="paused" if rng.random() < 0.05 else "active"))
    return rows


def pause_plan(rng: random.Random, duties: list[dict]) -> dict[int, list[tuple[int, str]]]:
    """Per duty, (tick index, new state) events: paused and resumed, paused for good,
    archived, or resumed from a paused start."""
    plan = {}
    for d in duties:
        roll = rng.random()
        a, b = sorted(rng.sample(range(1, len(TICKS)), 2))
        if d["state"] == "paused":
            plan[d["id"]] = [(a, "active")]
        elif roll < 0.15:
            plan[d["id"]] = [(a, "paused"), (b, "active")]
        elif roll < 0.20:
            plan[d["id"]] = [(a, "paused")]
        elif roll < 0.22:
            plan[d["id"]] = [(a, "archived")]
    return plan


def scheduled_run_through_dagster(frequency: str, tick: datetime) -> None:
    schedule = defs.resolve_schedule_def(f"{frequency}_tasks_schedule")
    with build_schedule_context(scheduled_execution_time=tick, resources=defs.resources) as context:
        (request,) = schedule.evaluate_tick(context).run_requests
    result = materialize([defs.resolve_assets_def(f"{frequency}_tasks")], instance=DagsterInstance.ephemeral(),
                         tags={**request.tags, MODE_TAG: "scheduled"}, run_config=request.run_config)
    assert result.success


@pytest.mark.slow
def test_a_year_of_hourly_ticks_produces_exactly_the_expected_tasks(engine):
    rng = random.Random(2026)
    rows = duty_mix(rng)
    ids = insert_duties(engine, rows)
    duties = [{**row, "id": duty_id} for row, duty_id in zip(rows, ids)]
    assert {"Pacific/Kiritimati", "Pacific/Pago_Pago", "Asia/Kathmandu", "Pacific/Chatham"} <= {
        d["timezone"] for d in duties}
    pauses = pause_plan(rng, duties)
    by_tick = defaultdict(list)
    for duty_id, events in pauses.items():
        for index, state in events:
            by_tick[index].append((duty_id, state))
    through_dagster = set(rng.sample(range(len(TICKS)), 4)) | {0}
    max_lead = max(LEADS)

    # The five frequencies' runs of a tick go at once, as the daemon launches their
    # schedules' runs: each run mostly waits on the server, so the year takes half the time.
    # A run holds at most a reader's connection and its writers' at once.
    runs = create_engine(engine.url, pool_size=(1 + DEFAULT_WRITERS) * len(FREQUENCIES))

    def scheduled_run(frequency: str, tick: datetime) -> None:
        first, last = open_range(frequency, tick, max_lead)
        report = dispatch(runs, frequency=frequency, mode=Mode.SCHEDULED, as_of=tick,
                          requested=periods_between(first, last))
        assert not report.unplannable and not gaps_after(runs, report).count, (tick, frequency)

    try:
        with ThreadPoolExecutor(max_workers=len(FREQUENCIES), thread_name_prefix="tick") as pool:
            for index, tick in enumerate(TICKS):
                if by_tick[index]:
                    with engine.begin() as conn:
                        for duty_id, state in by_tick[index]:
                            conn.execute(text("UPDATE duty SET state = :s WHERE id = :d"), {"s": state, "d": duty_id})
                if index in through_dagster:
                    for frequency in FREQUENCIES:
                        scheduled_run_through_dagster(frequency, tick)
                    continue
                done = [pool.submit(scheduled_run, frequency, tick) for frequency in FREQUENCIES]
                failed = [run.exception() for run in done if run.exception()]
                if failed:
                    raise ExceptionGroup(f"the runs of {tick.isoformat()}", failed)
    finally:
        runs.dispose()

    expected = expected_tasks(duties, pauses)
    with engine.connect() as conn:
        actual = defaultdict(list)
        for duty_id, key in conn.execute(text("SELECT duty_id, period_key FROM task ORDER BY duty_id, period_key")):
            actual[duty_id].append(key)
        total, distinct = conn.execute(text("SELECT count(*), count(DISTINCT (duty_id, period_key)) FROM task")).one()
        marks = dict(conn.execute(text("SELECT id, last_dispatched_period FROM duty")).all())
    by_id = {d["id"]: d for d in duties}
    mismatched = {d: (sorted(set(keys) - set(actual.get(d, []))), sorted(set(actual.get(d, [])) - set(keys)),
                      by_id[d], pauses.get(d))
                  for d, keys in expected.items() if actual.get(d, []) != keys}
    assert not mismatched, f"{len(mismatched)} duties differ (expected-only, actual-only, duty, pauses): " + \
        repr(list(mismatched.values())[:4])
    assert total == distinct == sum(len(keys) for keys in expected.values())
    assert marks == {d: (keys[-1] if keys else None) for d, keys in expected.items()}
    # The year exercised what it was meant to: gaps left by pauses, closed windows, long leads.
    assert sum(1 for d in duties if expected[d["id"]] and d["lead_days"] == 366) > 10
    assert total > 20_000
