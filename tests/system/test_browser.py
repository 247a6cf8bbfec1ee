"""What the Dagster UI shows a person, in a real Chromium against a real `rota dev`: a
backfill selected and launched by clicking, after the operator moved rota's history back
to reach it, the backfill shown succeeded with no partition failed, each partition's own
counts, no partition missing, and checks with results, not skips. (A fresh install's
partitions are tests/system/test_fresh_start.py's.)

Screenshots of each step are kept under .rota/browser/. Debian's `chromium` is driven
through Playwright (`executable_path`: Playwright's own browser download cannot reach
the internet here); `.ci/run` installs it, elsewhere the test skips saying why."""

import re
import shutil
from datetime import datetime, time, timedelta, timezone

import pytest
from sqlalchemy import text

from rota.pipelines.periods.calendar import following, period_containing, period_from_partition_key
from rota.pipelines.periods.partitions import first_task_partition
from rota.pipelines.queue.enqueue import enqueue_scheduled
from rota.pipelines.queue.jobs import register_job
from tests.helpers import duty_values, insert_duties
from tests.paths import CHECKOUT_STATE
from tests.system.test_end_to_end import answers, graphql, start_rota_dev, wait_for
from tests.system.test_fresh_start import PARTITIONS

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = CHECKOUT_STATE / "browser"
HISTORY_START = (datetime.now(timezone.utc) - timedelta(days=400)).date()

BACKFILLS = "{ partitionBackfillsOrError { ... on PartitionBackfills { results { id status } } } }"
RUNS = """
query Runs($id: String!) {
  runsOrError(filter: {tags: [{key: "dagster/backfill", value: $id}]}) { ... on Runs { results { status } } }
}
"""
RUNS_TAGGED = """
query Runs($key: String!, $value: String!) {
  runsOrError(filter: {tags: [{key: $key, value: $value}]}) { ... on Runs { results { status } } }
}
"""


@pytest.fixture
def rota_dev(database_url, test_server, tmp_path):
    """`rota dev` as installed: hourly dispatch schedules, so no scheduled run races the clicks.
    Its history starts 400 days back, where the operator moved it to backfill a year."""
    yield from start_rota_dev(database_url, test_server, tmp_path, {}, history_start=HISTORY_START.isoformat())


@pytest.fixture
def browser():
    if CHROMIUM is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = chromium.new_page(viewport={"width": 1400, "height": 1000})
        try:
            yield page
        finally:
            page.screenshot(path=str(SHOTS / "last.png"), full_page=True)
            chromium.close()


def _open(page, port, path, shot):
    page.goto(f"http://127.0.0.1:{port}{path}")
    page.get_by_text("Materialized (", exact=False).wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    skip = page.get_by_role("button", name="Skip")  # Dagster's community sign-up, shown now and then
    if skip.is_visible():
        skip.click()
    page.screenshot(path=str(SHOTS / shot), full_page=True)


def _count(page, label):
    text = page.get_by_text(f"{label} (", exact=False).first.inner_text()
    return int(re.search(r"\((\d+)\)", text).group(1))


def test_a_backfill_launched_by_clicking_succeeds_and_every_partition_shows_its_own_counts(
        engine, rota_dev, browser):
    process, port, log_path = rota_dev
    zones = ["UTC", "Asia/Tokyo", "America/Denver", "Europe/Berlin", "Pacific/Auckland"]
    insert_duties(engine, [duty_values(timezone=zones[n % 5], title=f"duty {n}") for n in range(40)])
    # Every month the asset offers: from the history start to the one begun in UTC+14.
    now = datetime.now(timezone.utc)
    first = period_from_partition_key("monthly", first_task_partition(
        "monthly", datetime.combine(HISTORY_START, time(), timezone.utc)))
    current = period_containing("monthly", (now + timedelta(hours=14)).date())
    months = [first]
    while months[-1] != current:
        months.append(following(months[-1]))
    reached = [m for m in months if m.start <= (now - timedelta(hours=12)).date()]
    assert len(months) >= 13 and len(reached) >= 12

    wait_for(lambda: answers(port) or process.poll() is not None, 120, "the Dagster webserver")
    assert process.poll() is None, log_path.read_text()[-4000:]
    # The history moved back 400 days for the tasks only: the queue's hours and the
    # maintenance nights still begin at the install, so none of their past looks owed.
    stats = {n["assetKey"]["path"][0]: n["partitionStats"] for n in graphql(port, PARTITIONS, {})["assetNodes"]}
    assert stats["scheduled_runs"]["numPartitions"] <= 4 and stats["nightly_maintenance"]["numPartitions"] <= 1, stats
    page = browser
    _open(page, port, "/assets/monthly_tasks?view=partitions", "1-monthly-before.png")
    # Only what `rota dev` dispatched at start, before these duties: the month current
    # somewhere on Earth (two around a month's turn). Nothing later is offered at all.
    assert _count(page, "Materialized") <= 2
    assert _count(page, "Materialized") + _count(page, "Missing") == len(months)

    page.get_by_role("button", name="Materialize…").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Partition selection").wait_for()
    # The dialog offers the last 90 days first; a thirteen-month range needs them all.
    dialog.get_by_role("button", name="Show all partitions").click()
    selection = dialog.locator("input[type=text]").first
    selection.fill(f"[{months[0].partition_key}...{months[-1].partition_key}]")
    selection.press("Enter")
    dialog.get_by_text(f"{len(months)} partitions").wait_for()
    page.screenshot(path=str(SHOTS / "2-launch-dialog.png"))
    dialog.get_by_role("button", name="Launch backfill").click()
    page.get_by_text("Created backfill", exact=False).wait_for(timeout=30_000)

    statuses = []  # kept with the screenshots: every status Dagster showed for it

    def finished():
        [backfill] = graphql(port, BACKFILLS, {})["partitionBackfillsOrError"]["results"]
        statuses.append(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')} {backfill['status']}")
        return backfill if backfill["status"] not in ("REQUESTED", "CANCELING") else None

    # Dagster's own verdict, the first it gives: nothing repairs it afterwards.
    backfill = wait_for(finished, 300, "the backfill to finish", interval=2)
    assert backfill["status"] == "COMPLETED_SUCCESS", statuses
    runs = graphql(port, RUNS, {"id": backfill["id"]})["runsOrError"]["results"]
    assert [r["status"] for r in runs] == ["SUCCESS"]  # one run over the range, and it succeeded
    page.goto(f"http://127.0.0.1:{port}/runs/b/{backfill['id']}")
    page.get_by_text("Succeeded", exact=True).first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    (SHOTS / "3-backfill-statuses.txt").write_text("\n".join(statuses) + "\n")
    page.screenshot(path=str(SHOTS / "3-backfill-succeeded.png"), full_page=True)
    # Targeted, in progress, succeeded, failed: every month succeeded.
    row = re.search(r"monthly_tasks\s+(\d+)% completed\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", page.inner_text("body"))
    assert [int(n) for n in row.groups()] == [100, len(months), 0, len(months), 0], page.inner_text("body")
    page.goto(f"http://127.0.0.1:{port}/runs")  # the runs list shows the backfill as one row
    page.get_by_text(backfill["id"]).first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    page.screenshot(path=str(SHOTS / "3-runs-list.png"), full_page=True)
    assert page.get_by_text("Failure", exact=True).count() == 0  # no run, and not the backfill's row
    # Both checks show results of this run, neither a skip.
    page.goto(f"http://127.0.0.1:{port}/assets/monthly_tasks?view=checks")
    page.get_by_text("current_period_dispatched").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    page.screenshot(path=str(SHOTS / "3-checks.png"), full_page=True)
    checks = page.inner_text("body")
    assert "every_eligible_duty_has_one_task" in checks and "Passed" in checks, checks
    assert "Skipped" not in checks

    _open(page, port, "/assets/monthly_tasks?view=partitions", "4-monthly-after.png")
    assert (_count(page, "Materialized"), _count(page, "Missing"), _count(page, "Failed")) == (len(months), 0, 0)
    # The catalog's row: every month materialized, none missing, failed or in progress.
    page.goto(f"http://127.0.0.1:{port}/assets")
    page.get_by_text("monthly_tasks").first.wait_for(timeout=60_000)
    page.wait_for_timeout(3000)
    page.screenshot(path=str(SHOTS / "4-catalog.png"), full_page=True)
    catalog = page.inner_text("body")
    row = catalog[catalog.index("monthly_tasks\nmonthly_tasks"):catalog.index("nightly_maintenance\nnightly_maintenance")]
    assert re.search(rf"\nAll\n0\n0\n0\n{len(months)} partitions", row), row
    # The schedule page and the runs list agree: rota dev's first dispatch ran as the
    # tick's run but says it was rota dev's, so no run claims a tick the page never had.
    page.goto(f"http://127.0.0.1:{port}/locations/rota/schedules/monthly_tasks_schedule")
    page.get_by_text("Latest tick").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    page.screenshot(path=str(SHOTS / "4-schedule.png"), full_page=True)
    never = "Schedule has never run" in page.inner_text("body")
    tagged = graphql(port, RUNS_TAGGED, {"key": "dagster/schedule_name", "value": "monthly_tasks_schedule"})
    started = graphql(port, RUNS_TAGGED, {"key": "rota/started_by", "value": "rota dev"})
    # (A top of the hour during the test is a real tick, on both.)
    assert never == (tagged["runsOrError"]["results"] == []), (never, tagged)
    assert len(started["runsOrError"]["results"]) == 5
    _open(page, port, "/assets/monthly_tasks?view=partitions", "4-monthly-after.png")
    # A month no scheduled run ever creates (it is past everywhere): the backfill made it.
    past = reached[-3]
    page.get_by_text(past.partition_key, exact=True).first.click()
    page.get_by_text("outside_window", exact=True).wait_for()
    page.screenshot(path=str(SHOTS / "5-a-past-partition.png"), full_page=True)
    details = page.inner_text("body")
    # Its own period's count (40 duties, one task each), not the run's total.
    assert re.search(r"created\s+40\b", details), details[-1500:]
    assert re.search(rf"period\s+{past.key}\b", details)


def _skip_sign_up(page):
    skip = page.get_by_role("button", name="Skip")  # Dagster's community sign-up, shown now and then
    if skip.is_visible():
        skip.click()


def test_an_operator_sees_a_failed_queue_run_with_its_error_and_retries_it_from_the_launchpad(
        engine, rota_dev, browser):
    process, port, log_path = rota_dev
    job_id = register_job(engine, "mail", max_attempts=1)  # no handler: rota dev's worker fails its run
    failed = enqueue_scheduled(engine, job_id, datetime.now(timezone.utc).replace(microsecond=0)).run_id

    def row():
        with engine.connect() as conn:
            return conn.execute(text("SELECT state, operator_action, operator_run_id FROM job_queue WHERE id = :id"),
                                {"id": failed}).one()

    wait_for(lambda: row().state == "failed", 180, "rota dev's worker to fail the run")
    wait_for(lambda: answers(port) or process.poll() is not None, 120, "the Dagster webserver")
    assert process.poll() is None, log_path.read_text()[-4000:]
    page = browser

    def shown():
        page.goto(f"http://127.0.0.1:{port}/assets/job_queue")
        page.get_by_text("Latest materialization").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        return page.get_by_text("no handler is registered for job 'mail'").count() > 0

    # job_queue_sensor reports the queue every minute: the failed run, its job and its error.
    wait_for(shown, 240, "the failed run on the job_queue asset", interval=5)
    _skip_sign_up(page)
    page.screenshot(path=str(SHOTS / "7-job-queue.png"), full_page=True)
    assert re.search(rf"\b{failed}\s+mail\s+1\b", page.inner_text("body"))

    page.goto(f"http://127.0.0.1:{port}/locations/rota/jobs/operate_job_queue/playground")
    page.locator(".CodeMirror").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    _skip_sign_up(page)
    # What an operator types into the launchpad's editor, set through CodeMirror's own API.
    page.evaluate("yaml => document.querySelector('.CodeMirror').CodeMirror.setValue(yaml)",
                  f"ops:\n  runs:\n    config:\n      retry: [{failed}]\n      cancel: []\n")
    page.screenshot(path=str(SHOTS / "8-retry-launchpad.png"), full_page=True)
    page.get_by_role("button", name="Launch Run").click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=30_000)
    dagster_run = page.url.rsplit("/", 1)[1]
    # The retry is recorded on the run's row, naming the Dagster run that did it; the worker
    # then takes the run again (and, with no handler, fails it again).
    wait_for(lambda: row().operator_action == "retried", 180, "the retry to be recorded")
    assert row().operator_run_id == dagster_run
