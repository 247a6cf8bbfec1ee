"""Sources: the produce upsert, the nightly maintenance Source and the GitHub Source."""

import re
import time
from datetime import datetime, timedelta, timezone

import pytest
from dagster import DagsterInstance, build_sensor_context, materialize
from sqlalchemy import create_engine, text

from rota.pipelines.definitions import defs
from rota.pipelines.queue.claims import ClaimedRun
from rota.pipelines.queue.enqueue import enqueue_scheduled
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.producing import produce, produce_many
from rota.pipelines.sources.github import GitHubClient, repository_cursors
from rota.pipelines.sources.nightly import compact_finished_runs, run_maintenance
from rota.resources.database.server import driver_url
from rota.resources.github import GitHubResource
from rota.resources.maintenance import MaintenanceSettings
from rota.resources.postgres import PostgresResource
from rota.schedules.github import poll_repositories
from tests.fake_github import FakeGitHub
from tests.helpers import claim_due_runs, complete, database_fingerprint, race_processes


def source_runs(engine, source=None):
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT source_ref, state, payload FROM job_queue "
            + ("WHERE source = :s " if source else "") + "ORDER BY source_ref"), {"s": source}).all()


def test_producing_twice_writes_one_row_and_the_second_writes_nothing(engine):
    register_job(engine, "triage")
    assert produce(engine, "tickets", "T-1", "triage", {"title": "Printer on fire"}) == "created"
    before = database_fingerprint(engine)
    assert produce(engine, "tickets", "T-1", "triage", {"title": "Printer on fire"}) == "unchanged"
    assert database_fingerprint(engine) == before
    assert len(source_runs(engine)) == 1


def test_a_queued_run_is_refreshed_and_a_running_or_finished_one_is_never_touched(engine):
    register_job(engine, "triage")
    produce_many(engine, "tickets", [(f"T-{n}", "triage", {"title": "old"}) for n in (1, 2, 3)])
    claimed = claim_due_runs(engine, "w", 2, timedelta(minutes=5))
    complete(engine, claimed[0].id, "w")
    before = {ref: row for ref, *row in source_runs(engine)}
    outcome = produce_many(engine, "tickets", [(f"T-{n}", "triage", {"title": "new"}) for n in (1, 2, 3, 4)])
    assert outcome.outcomes == {"T-1": "unchanged", "T-2": "unchanged", "T-3": "refreshed", "T-4": "created"}
    after = {ref: row for ref, *row in source_runs(engine)}
    assert after["T-1"] == before["T-1"] and after["T-2"] == before["T-2"]
    assert after["T-3"] == ["queued", {"title": "new"}]


def test_producing_for_an_unknown_job_is_refused_and_writes_nothing(engine):
    with pytest.raises(LookupError, match="no job named 'ghost'"):
        produce(engine, "tickets", "T-1", "ghost", {})
    assert source_runs(engine) == []


def _produce_refs(url, barrier, results):
    engine = create_engine(driver_url(url), pool_size=1)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    barrier.wait()
    try:
        outcome = produce_many(engine, "tickets", [(f"T-{n:04d}", "triage", {"n": n}) for n in range(1000)])
        results.put(outcome.count("created"))
    except Exception as error:  # reported to the parent, which fails the test
        results.put(repr(error))


def test_eight_processes_producing_the_same_thousand_refs_make_a_thousand_runs(database_url, engine):
    register_job(engine, "triage")
    outcomes = race_processes(_produce_refs, (database_url,))
    assert all(isinstance(o, int) for o in outcomes), outcomes
    assert sum(outcomes) == 1000 and len(source_runs(engine)) == 1000


def materialize_nights(first: str, last: str, raise_on_error=True):
    return materialize([defs.resolve_assets_def("nightly_maintenance")], instance=DagsterInstance.ephemeral(),
                       tags={"dagster/asset_partition_range_start": first,
                             "dagster/asset_partition_range_end": last},
                       raise_on_error=raise_on_error)


def test_the_nightly_source_makes_one_run_per_night_however_often_it_runs(engine):
    today = datetime.now(timezone.utc).date()
    day = (today - timedelta(days=40)).isoformat()
    assert materialize_nights(day, day).success
    assert materialize_nights(day, day).success
    month = [(today - timedelta(days=n)).isoformat() for n in range(45, 15, -1)]
    assert materialize_nights(month[0], month[-1]).success
    before = database_fingerprint(engine)
    assert materialize_nights(month[0], month[-1]).success
    assert database_fingerprint(engine) == before
    refs = [ref for ref, *_ in source_runs(engine, "nightly")]
    assert refs == sorted({f"nightly/{d}" for d in month + [day]})


def test_nightly_maintenance_reclaims_compacts_and_analyzes(engine, monkeypatch):
    monkeypatch.setenv("ROTA_RETENTION_DAYS", "10")
    job_id = register_job(engine, "report", schedule="* * * * *")
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for n in range(4):
        enqueue_scheduled(engine, job_id, t0 + timedelta(minutes=n))
    with engine.begin() as conn:
        conn.execute(text(
            "UPDATE job_queue SET state = 'succeeded', finished_at = now() - interval '11 days' "
            "WHERE scheduled_for = :t"), {"t": t0})
        conn.execute(text(
            "UPDATE job_queue SET state = 'succeeded', finished_at = now() - interval '9 days' "
            "WHERE scheduled_for = :t"), {"t": t0 + timedelta(minutes=1)})
        conn.execute(text(
            "UPDATE job_queue SET state = 'running', lease_owner = 'gone', attempts = 1, "
            "lease_expires_at = now() - interval '1 minute' WHERE scheduled_for = :t"),
            {"t": t0 + timedelta(minutes=2)})
    reltuples = text("SELECT reltuples FROM pg_class WHERE relname = 'job_queue'")
    with engine.connect() as conn:
        assert conn.execute(reltuples).scalar_one() == -1  # never analyzed
    run_maintenance(ClaimedRun(0, 0, "nightly-maintenance", None, 1, 1, {}, None, None, "nightly",
                               "nightly/2026-12-01"), engine)
    with engine.connect() as conn:
        states = conn.execute(text("SELECT scheduled_for, state FROM job_queue ORDER BY 1")).all()
        assert conn.execute(reltuples).scalar_one() == 4
    assert [s for _, s in states] == ["succeeded", "succeeded", "queued", "queued"]


def test_compaction_drops_only_the_payload_and_error_of_finished_runs_past_retention(engine):
    job_id = register_job(engine, "report", schedule="* * * * *")
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for n in range(3):
        enqueue_scheduled(engine, job_id, t0 + timedelta(minutes=n))
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET payload = '{\"big\": true}', last_error = 'boom'"))
        conn.execute(text("UPDATE job_queue SET state = 'failed', finished_at = now() - interval '500 days' "
                          "WHERE scheduled_for = :t"), {"t": t0})
        conn.execute(text("UPDATE job_queue SET run_at = now() - interval '500 days' WHERE scheduled_for = :t"),
                     {"t": t0 + timedelta(minutes=1)})
    assert compact_finished_runs(engine, MaintenanceSettings()) == 1
    before = database_fingerprint(engine)
    assert compact_finished_runs(engine, MaintenanceSettings()) == 0
    assert database_fingerprint(engine) == before
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT scheduled_for, state, payload, last_error FROM job_queue ORDER BY 1")).all()
    assert [tuple(r[1:]) for r in rows] == [("failed", {}, None), ("queued", {"big": True}, "boom"),
                                            ("queued", {"big": True}, "boom")]


# ----------------------------------------------------------------------- GitHub

@pytest.fixture
def github():
    with FakeGitHub() as fake:
        yield fake


def poll(fake, database_url, repositories="octo/cat", token="ghp_secret-token", budget=40):
    """One poll; returns (the repositories' cursors as stored, what each did, errors)."""
    resource = GitHubResource(token=token, api_url=fake.url, repositories=repositories)
    client = GitHubClient(fake.url, token, timeout=2, budget=budget, backoff=0.05)
    database = PostgresResource(database_url=database_url)
    report, errors = poll_repositories(resource, database, client)
    cursors = {repo: {"etag": c.etag, "since": c.since} for repo, c in repository_cursors(database.engine()).items()}
    return cursors, report, errors


def test_two_pages_become_one_run_per_issue_and_pull_requests_are_excluded(database_url, engine, github):
    github.add_issues("octo/cat", 150, pull_requests=5)
    cursor, report, errors = poll(github, database_url)
    assert errors == [] and "150 open issues in 2 requests" in report["octo/cat"]
    assert "5 pull requests skipped" in report["octo/cat"]
    refs = [ref for ref, *_ in source_runs(engine, "github")]
    assert len(refs) == 150 and "octo/cat#1" in refs and "octo/cat#151" not in refs
    first = github.requests[0]
    assert first["query"]["per_page"] == "100" and first["query"]["state"] == "open"
    assert first["authorization"] == "Bearer ghp_secret-token"
    assert cursor["octo/cat"]["etag"] == github.etag("octo/cat") and cursor["octo/cat"]["since"]


def test_an_unchanged_repository_answers_304_and_costs_nothing(database_url, engine, github):
    github.add_issues("octo/cat", 30)
    cursor, _, _ = poll(github, database_url)
    before = database_fingerprint(engine)
    cursor_again, report, errors = poll(github, database_url)
    assert errors == [] and report["octo/cat"] == "not modified (304)"
    assert github.requests[-1]["if_none_match"] == cursor["octo/cat"]["etag"]
    assert cursor_again == cursor and database_fingerprint(engine) == before


def test_a_rate_limit_is_reported_at_once_and_the_next_poll_resumes(database_url, engine, github):
    """A poll runs inside a sensor evaluation, which Dagster times out: it never waits for
    a reset, and the repositories after the limited one are left to the next poll."""
    github.add_issues("octo/cat", 3)
    github.add_issues("octo/dog", 2)
    github.script.append({"status": 403, "reset_in": 3600, "body": '{"message": "API rate limit exceeded"}'})
    started = time.monotonic()
    cursors, report, errors = poll(github, database_url, repositories="octo/cat,octo/dog")
    assert time.monotonic() - started < 5
    assert len(errors) == 1 and "octo/cat: rate limited by GitHub" in errors[0]
    assert report == {} and cursors == {} and len(github.requests) == 1 and source_runs(engine) == []
    cursors, report, errors = poll(github, database_url, repositories="octo/cat,octo/dog")
    assert errors == [] and len(source_runs(engine)) == 5 and set(cursors) == {"octo/cat", "octo/dog"}


def test_retries_stop_at_the_polls_deadline(database_url, engine, github):
    github.add_issues("octo/cat", 3)
    github.script += [{"status": 503}] * 4
    started = time.monotonic()
    _, _, errors = poll(github, database_url, budget=2.1)
    assert time.monotonic() - started < 3
    assert errors == ["octo/cat: out of time for this poll (the sensor evaluation would time out); "
                      "the next poll resumes"]


def test_a_server_error_is_retried_with_backoff(database_url, engine, github):
    github.add_issues("octo/cat", 3)
    github.script += [{"status": 500}, {"status": 502}]
    _, report, errors = poll(github, database_url)
    assert errors == [] and len(source_runs(engine)) == 3 and len(github.requests) == 3


def test_malformed_json_names_the_repository_and_writes_nothing(database_url, engine, github):
    github.add_issues("octo/cat", 150)
    github.add_issues("octo/dog", 2)
    github.script.append({})  # page 1 of octo/cat is served normally
    github.script.append({"status": 200, "body": "[{\"number\": 101, \"title\": ", "headers": {}})
    cursor, report, errors = poll(github, database_url, repositories="octo/cat,octo/dog")
    assert len(errors) == 1 and "octo/cat: malformed JSON on page 2" in errors[0]
    assert "octo/cat" not in cursor and "octo/dog" in cursor
    assert [ref for ref, *_ in source_runs(engine)] == ["octo/dog#1", "octo/dog#2"]


def test_a_title_change_refreshes_a_queued_run_and_leaves_a_finished_one(database_url, engine, github):
    github.add_issues("octo/cat", 2)
    cursor, _, _ = poll(github, database_url)
    (claimed,) = claim_due_runs(engine, "w", 1, timedelta(minutes=5))
    complete(engine, claimed.id, "w")
    ran = claimed.source_ref
    waiting = "octo/cat#1" if ran == "octo/cat#2" else "octo/cat#2"
    for ref in (ran, waiting):
        github.set_title("octo/cat", int(ref.split("#")[1]), "Renamed", "2026-11-30T12:00:00Z")
    _, report, _ = poll(github, database_url)
    assert "1 refreshed, 1 unchanged" in report["octo/cat"]
    runs = {ref: (state, payload["title"]) for ref, state, payload in source_runs(engine)}
    assert runs[waiting] == ("queued", "Renamed") and runs[ran] == ("succeeded", f"Issue {ran.split('#')[1]}")


def test_a_reopened_issue_makes_no_new_run(database_url, engine, github):
    github.add_issues("octo/cat", 1)
    cursor, _, _ = poll(github, database_url)
    github.set_title("octo/cat", 1, "Issue 1", "2026-11-30T12:00:00Z")  # closed and reopened: same number
    poll(github, database_url)
    assert len(source_runs(engine)) == 1


def test_a_thousand_issues_over_ten_pages_then_a_poll_of_all_304s(database_url, engine, github):
    for n in range(10):
        github.add_issues(f"octo/repo{n}", 100, start=1)
    repositories = ",".join(f"octo/repo{n}" for n in range(10))
    cursor, report, errors = poll(github, database_url, repositories=repositories)
    assert errors == [] and len(source_runs(engine)) == 1000
    before = database_fingerprint(engine)
    cursor_again, report, errors = poll(github, database_url, repositories=repositories)
    assert errors == [] and set(report.values()) == {"not modified (304)"}
    assert database_fingerprint(engine) == before and cursor_again == cursor


def test_a_thousand_issues_in_one_repository_take_a_page_each_and_the_overlaps(database_url, engine, github):
    """Each page after the first starts at the newest instant the last one reached
    (inclusive), so it repeats that instant's issues: 36 here, about a third of a page."""
    github.add_issues("octo/cat", 1000)
    _, report, errors = poll(github, database_url)
    requests = int(re.search(r"1000 open issues in (\d+) requests", report["octo/cat"]).group(1))
    assert errors == [] and 10 <= requests <= 16, report
    assert len(source_runs(engine)) == 1000


def test_an_issue_updated_while_the_pages_are_read_shifts_none_out_of_the_poll(database_url, engine, github):
    """150 open issues; after page 1 is served, one of its issues is commented on and moves to
    the end of the `sort=updated` order. Offset pages would then skip the issue that slid
    into page 1's range; keyset pages on `updated_at` skip none, now or at later polls."""
    github.add_issues("octo/cat", 150)
    github.after_page.append(lambda repository: github.set_title(repository, 1, "Issue 1", "2026-12-01T09:00:00Z"))
    cursor, report, errors = poll(github, database_url)
    assert errors == []
    refs = {ref for ref, *_ in source_runs(engine, "github")}
    assert refs == {f"octo/cat#{n}" for n in range(1, 151)}, sorted(set(f"octo/cat#{n}" for n in range(1, 151)) - refs)
    assert cursor["octo/cat"]["since"] == "2026-12-01T09:00:00Z"


def test_a_persistent_outage_fails_loudly_naming_the_repository(database_url, engine, github):
    github.add_issues("octo/cat", 1)
    github.script += [{"status": 503}] * 4
    _, _, errors = poll(github, database_url)
    assert errors == ["octo/cat: GitHub answered 503 4 times"]
    assert source_runs(engine) == []


def evaluate_github_sensor(fake, database_url, repositories="octo/cat"):
    """One tick of the sensor as the daemon runs it: "ok", or "failed" with the error kept
    on `fake.failed_tick`."""
    sensor = defs.resolve_sensor_def("github_issues_sensor")
    resources = {"database": PostgresResource(database_url=database_url),
                 "github": GitHubResource(api_url=fake.url, repositories=repositories, token="ghp_secret-token")}
    with build_sensor_context(resources=resources, instance=DagsterInstance.ephemeral()) as context:
        try:
            sensor.evaluate_tick(context)
        except Exception as error:  # noqa: BLE001 - what a failed tick shows
            fake.failed_tick = str(error)
            return "failed"
    return "ok"


def test_one_failing_repository_fails_the_tick_naming_it_and_the_others_keep_their_progress(
        database_url, engine, github):
    github.add_issues("octo/cat", 2)
    github.add_issues("octo/dog", 2)
    github.missing.add("octo/gone")
    assert evaluate_github_sensor(github, database_url, "octo/cat,octo/gone,octo/dog") == "failed"
    assert github.failed_tick and "octo/gone: GitHub answered 404" in github.failed_tick
    assert sorted(ref for ref, *_ in source_runs(engine)) == ["octo/cat#1", "octo/cat#2", "octo/dog#1", "octo/dog#2"]
    asked = len(github.requests)
    assert evaluate_github_sensor(github, database_url, "octo/cat,octo/gone,octo/dog") == "failed"
    again = github.requests[asked:]
    # The repositories that answered before ask with their ETags now: nothing was lost.
    assert [(r["path"], r["if_none_match"] is not None) for r in again] == [
        ("/repos/octo/cat/issues", True), ("/repos/octo/gone/issues", False), ("/repos/octo/dog/issues", True)]
    github.add_issues("octo/cat", 1, start=3)
    github.script += [{"status": 503}] * 4
    assert evaluate_github_sensor(github, database_url, "octo/cat") == "failed"
    assert "octo/cat: GitHub answered 503 4 times" in github.failed_tick
    assert len(source_runs(engine)) == 4
