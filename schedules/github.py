"""The GitHub Source's poll, every five minutes."""

import json

from dagster import DefaultSensorStatus, SensorEvaluationContext, SkipReason, sensor

from pipelines.sources.github import GitHubClient, GitHubError, RepoCursor, produce_issues
from resources.github import GitHubResource
from resources.postgres import PostgresResource


def poll_repositories(github: GitHubResource, database: PostgresResource, cursor: dict,
                      client: GitHubClient | None = None) -> tuple[dict, dict[str, str], list[str]]:
    """Poll every configured repository; returns (new cursor, what each did, errors).
    One repository's failure does not stop the others, and writes nothing of its own."""
    client = client or GitHubClient(github.api_url, github.token, timeout=github.timeout_seconds,
                                    max_wait=github.max_rate_limit_wait_seconds)
    cursor = dict(cursor)
    report: dict[str, str] = {}
    errors: list[str] = []
    for repository in github.repository_list():
        try:
            poll = client.open_issues(repository, RepoCursor(**cursor.get(repository, {})))
        except GitHubError as error:
            errors.append(str(error))
            continue
        if poll.not_modified:
            report[repository] = "not modified (304)"
            continue
        produced = produce_issues(database.engine(), poll)
        cursor[repository] = {"etag": poll.cursor.etag, "since": poll.cursor.since}
        report[repository] = (f"{len(poll.issues)} open issues in {poll.requests} requests: "
                              f"{produced.count('created')} created, {produced.count('refreshed')} "
                              f"refreshed, {produced.count('unchanged')} unchanged; "
                              f"{poll.pull_requests_skipped} pull requests skipped")
    return cursor, report, errors


@sensor(
    name="github_issues_sensor",
    minimum_interval_seconds=300,
    default_status=DefaultSensorStatus.RUNNING,
    description="Every five minutes: one run per open issue of each repository in "
                "ROTA_GITHUB_REPOSITORIES (ref owner/repo#number).",
)
def github_issues_sensor(context: SensorEvaluationContext, github: GitHubResource, database: PostgresResource):
    if not github.repository_list():
        return SkipReason("no repositories configured (set ROTA_GITHUB_REPOSITORIES=owner/repo,...)")
    cursor, report, errors = poll_repositories(github, database, json.loads(context.cursor or "{}"))
    context.update_cursor(json.dumps(cursor, sort_keys=True))
    for repository, outcome in report.items():
        context.log.info("%s: %s", repository, outcome)
    if errors:
        raise GitHubError("; ".join(errors))
    return SkipReason("; ".join(f"{r}: {o}" for r, o in report.items()))


GITHUB_SENSORS = [github_issues_sensor]
