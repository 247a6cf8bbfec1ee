"""Sources: the produce upsert, the nightly maintenance Source and the GitHub Source."""

import json
from datetime import date, datetime, timedelta, timezone

import pytest
from dagster import DagsterInstance, build_sensor_context, materialize
from sqlalchemy import create_engine, text

from pipelines.definitions import defs
from pipelines.queue import (
    ClaimedRun,
    claim_due_runs,
    complete,
    enqueue_scheduled,
    produce,
    produce_many,
    register_job,
)
from pipelines.sources import sources
from pipelines.sources.github import GitHubClient, issue_ref
from pipelines.sources.nightly import nightly_ref, prune_finished_runs, run_maintenance
from resources.github import GitHubResource
from resources.maintenance import MaintenanceSettings
from resources.postgres import PostgresResource
from resources.server import driver_url
from schedules.github import poll_repositories
from tests.fake_github import FakeGitHub
from tests.helpers import database_fingerprint, race_processes


def source_runs(engine, source=None):
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT source_ref, state, payload FROM job_queue "
            + ("WHERE source = :s " if source else "") + "ORDER BY source_ref"), {"s": source}).all()


def test_each_sources_ref_convention_is_pinned():
    assert nightly_ref(date(2026, 12, 2)) == "nightly/2026-12-02"
    assert issue_ref("octo/cat", 7) == "octo/cat#7"
    assert {name: (s.job_name, s.ref_convention) for name, s in sources().items()} == {
        "nightly": ("nightly-maintenance", "nightly/YYYY-MM-DD"),
        "github": ("github-issue", "owner/repo#number"),
    }


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


def test_a_nightly_backfill_beyond_the_horizon_is_refused(engine):
    old = (datetime.now(timezone.utc).date() - timedelta(days=401)).isoformat()
    result = materialize_nights(old, old, raise_on_error=False)
    assert not result.success
    assert "beyond the backfill horizon" in str(result.get_step_failure_events()[0].step_failure_data.error)
    assert source_runs(engine) == []


def test_retention_shorter_than_the_backfill_horizon_is_refused():
    with pytest.raises(Exception, match=r"retention_days \(30\) must be longer than backfill_horizon_days \(90\)"):
        MaintenanceSettings(retention_days=30, backfill_horizon_days=90)
    MaintenanceSettings(retention_days=91, backfill_horizon_days=90)


def test_nightly_maintenance_reclaims_prunes_and_analyzes(engine, monkeypatch):
    monkeypatch.setenv("ROTA_RETENTION_DAYS", "10")
    monkeypatch.setenv("ROTA_BACKFILL_HORIZON_DAYS", "5")
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
        assert conn.execute(reltuples).scalar_one() == 3
    assert [s for _, s in states] == ["succeeded", "queued", "queued"]


def test_pruning_deletes_only_finished_runs_past_retention(engine):
    job_id = register_job(engine, "report", schedule="* * * * *")
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for n in range(3):
        enqueue_scheduled(engine, job_id, t0 + timedelta(minutes=n))
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET state = 'failed', finished_at = now() - interval '500 days' "
                          "WHERE scheduled_for = :t"), {"t": t0})
        conn.execute(text("UPDATE job_queue SET run_at = now() - interval '500 days' WHERE scheduled_for = :t"),
                     {"t": t0 + timedelta(minutes=1)})
    assert prune_finished_runs(engine, MaintenanceSettings()) == 1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_queue")).scalar_one() == 2


# ----------------------------------------------------------------------- GitHub

@pytest.fixture
def github():
    with FakeGitHub() as fake:
        yield fake


def poll(fake, database_url, cursor=None, repositories="octo/cat", token="ghp_secret-token"):
    resource = GitHubResource(token=token, api_url=fake.url, repositories=repositories)
    client = GitHubClient(fake.url, token, timeout=2, max_wait=10, backoff=0.05)
    return poll_repositories(resource, PostgresResource(database_url=database_url), cursor or {}, client)


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
    cursor_again, report, errors = poll(github, database_url, cursor)
    assert errors == [] and report["octo/cat"] == "not modified (304)"
    assert github.requests[-1]["if_none_match"] == cursor["octo/cat"]["etag"]
    assert cursor_again == cursor and database_fingerprint(engine) == before


def test_a_rate_limit_is_waited_out_until_its_reset(database_url, engine, github):
    github.add_issues("octo/cat", 3)
    github.script.append({"status": 403, "reset_in": 1, "body": '{"message": "API rate limit exceeded"}'})
    started = datetime.now(timezone.utc)
    _, report, errors = poll(github, database_url)
    assert errors == [] and len(source_runs(engine)) == 3
    assert (datetime.now(timezone.utc) - started).total_seconds() >= 0.5
    assert len(github.requests) == 2


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
    _, report, _ = poll(github, database_url, cursor)
    assert "1 refreshed, 1 unchanged" in report["octo/cat"]
    runs = {ref: (state, payload["title"]) for ref, state, payload in source_runs(engine)}
    assert runs[waiting] == ("queued", "Renamed") and runs[ran] == ("succeeded", f"Issue {ran.split('#')[1]}")


def test_a_reopened_issue_makes_no_new_run(database_url, engine, github):
    github.add_issues("octo/cat", 1)
    cursor, _, _ = poll(github, database_url)
    github.set_title("octo/cat", 1, "Issue 1", "2026-11-30T12:00:00Z")  # closed and reopened: same number
    poll(github, database_url, cursor)
    assert len(source_runs(engine)) == 1


def test_a_thousand_issues_over_ten_pages_then_a_poll_of_all_304s(database_url, engine, github):
    for n in range(10):
        github.add_issues(f"octo/repo{n}", 100, start=1)
    repositories = ",".join(f"octo/repo{n}" for n in range(10))
    cursor, report, errors = poll(github, database_url, repositories=repositories)
    assert errors == [] and len(source_runs(engine)) == 1000
    before = database_fingerprint(engine)
    cursor_again, report, errors = poll(github, database_url, cursor, repositories=repositories)
    assert errors == [] and set(report.values()) == {"not modified (304)"}
    assert database_fingerprint(engine) == before and cursor_again == cursor


def test_a_thousand_issues_in_one_repository_take_ten_pages(database_url, engine, github):
    github.add_issues("octo/cat", 1000)
    _, report, errors = poll(github, database_url)
    assert errors == [] and "1000 open issues in 10 requests" in report["octo/cat"]
    assert len(source_runs(engine)) == 1000


def test_a_persistent_outage_fails_loudly_naming_the_repository(database_url, engine, github):
    github.add_issues("octo/cat", 1)
    github.script += [{"status": 503}] * 4
    _, _, errors = poll(github, database_url)
    assert errors == ["octo/cat: GitHub answered 503 4 times"]
    assert source_runs(engine) == []


def evaluate_github_sensor(fake, database_url, cursor=None):
    sensor = defs.resolve_sensor_def("github_issues_sensor")
    resources = {"database": PostgresResource(database_url=database_url),
                 "github": GitHubResource(api_url=fake.url, repositories="octo/cat", token="ghp_secret-token")}
    with build_sensor_context(cursor=cursor, resources=resources, instance=DagsterInstance.ephemeral()) as context:
        return sensor.evaluate_tick(context)


def test_the_sensor_keeps_its_cursor_and_fails_loudly_on_an_outage(database_url, engine, github):
    github.add_issues("octo/cat", 2)
    tick = evaluate_github_sensor(github, database_url)
    assert json.loads(tick.cursor)["octo/cat"]["etag"] == github.etag("octo/cat")
    assert len(source_runs(engine)) == 2
    github.add_issues("octo/cat", 1, start=3)
    github.script += [{"status": 503}] * 4
    with pytest.raises(Exception, match="octo/cat: GitHub answered 503 4 times"):
        evaluate_github_sensor(github, database_url, tick.cursor)
    assert len(source_runs(engine)) == 2
