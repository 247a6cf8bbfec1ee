"""The GitHub Source's poll, every five minutes."""

from dagster import DefaultSensorStatus, SensorEvaluationContext, SkipReason, sensor

from rota.pipelines.sources.github import (
    GitHubClient,
    GitHubError,
    RateLimited,
    RepoCursor,
    produce_issues,
    repository_cursors,
)
from rota.resources.github import GitHubResource
from rota.resources.postgres import PostgresResource


def poll_repositories(github: GitHubResource, database: PostgresResource,
                      client: GitHubClient | None = None) -> tuple[dict[str, str], list[str]]:
    """Poll every configured repository from where its last successful poll got to;
    returns (what each did, errors). Each repository's runs and cursor are written
    together, so one repository's failure costs the others nothing. A rate limit stops
    the poll: every later repository would meet it too."""
    client = client or GitHubClient(github.api_url, github.token, timeout=github.timeout_seconds,
                                    budget=github.poll_budget_seconds)
    engine = database.engine()
    cursors = repository_cursors(engine)
    report: dict[str, str] = {}
    errors: list[str] = []
    for repository in github.repository_list():
        try:
            poll = client.open_issues(repository, cursors.get(repository, RepoCursor()))
        except RateLimited as error:
            errors.append(str(error))
            break
        except GitHubError as error:
            errors.append(str(error))
            continue
        if poll.not_modified:
            report[repository] = "not modified (304)"
            continue
        produced = produce_issues(engine, poll)
        report[repository] = (f"{len(poll.issues)} open issues in {poll.requests} requests: "
                              f"{produced.count('created')} created, {produced.count('refreshed')} "
                              f"refreshed, {produced.count('unchanged')} unchanged; "
                              f"{poll.pull_requests_skipped} pull requests skipped")
    return report, errors


@sensor(
    name="github_issues_sensor",
    minimum_interval_seconds=300,
    default_status=DefaultSensorStatus.RUNNING,
    description="Every five minutes: one run per open issue of each repository in "
                "ROTA_GITHUB_REPOSITORIES (ref owner/repo#number). A failing repository fails "
                "the tick, naming it; the others' runs and cursors are kept.",
)
def github_issues_sensor(context: SensorEvaluationContext, github: GitHubResource, database: PostgresResource):
    if not github.repository_list():
        return SkipReason("no repositories configured (set ROTA_GITHUB_REPOSITORIES=owner/repo,...)")
    report, errors = poll_repositories(github, database)
    for repository, outcome in report.items():
        context.log.info("%s: %s", repository, outcome)
    if errors:
        raise GitHubError(f"{len(errors)} of {len(github.repository_list())} repositories failed "
                          f"(the others' progress is kept): " + "; ".join(errors))
    return SkipReason("; ".join(f"{r}: {o}" for r, o in report.items()))


GITHUB_SENSORS = [github_issues_sensor]
