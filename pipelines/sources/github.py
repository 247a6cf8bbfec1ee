"""The GitHub Source: one run per open issue.

Ref convention: `owner/repo#number`. A reopened issue has the same ref, so it produces no
new run: its existing run is refreshed if it is still queued, and left alone once it has
run (a Source-level policy: an issue is one piece of work however often it reopens).
Pull requests, which GitHub's issues endpoint also returns, are excluded.

Polling is cheap when nothing changed: the first page is requested with the ETag of the
last poll (`If-None-Match`), and a 304 ends the poll for that repository. Later pages
are keyed on `updated_at` (see `open_issues`). Timeouts and 5xx answers are retried with backoff,
within the poll's time budget: a poll runs inside a sensor evaluation, which Dagster
times out, so it never sleeps past its deadline, and a rate limit is not waited out but
reported (the next poll, minutes later, resumes). A repository's pages are all fetched
before anything is written, so a bad page writes nothing; its runs and its cursor (ETag,
`since`) are written in one transaction, so one repository's failure costs no other
repository its progress."""

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import requests
from sqlalchemy import Engine, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from rota.pipelines.queue.claims import ClaimedRun
from rota.pipelines.queue.handlers import handler
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.producing import Produced, produce_many
from rota.pipelines.sources import Source
from rota.resources.database.queries import queries

QUERIES = queries("rota.pipelines.sources")

log = logging.getLogger(__name__)


def issue_ref(repository: str, number: int) -> str:
    return f"{repository}#{number}"


GITHUB = Source(name="github", job_name="github-issue", ref_convention="owner/repo#number", ref=issue_ref)
RETRIES = 4
PER_PAGE = 100


class GitHubError(RuntimeError):
    pass


class RateLimited(GitHubError):
    pass


@dataclass
class RepoCursor:
    etag: str | None = None
    since: str | None = None


@dataclass
class RepoPoll:
    repository: str
    cursor: RepoCursor
    not_modified: bool = False
    issues: list[dict] = field(default_factory=list)
    pull_requests_skipped: int = 0
    requests: int = 0


class GitHubClient:
    def __init__(self, api_url: str, token: str | None, *, timeout: float = 10.0, budget: float = 40.0,
                 backoff: float = 1.0, sleep: Callable[[float], None] = time.sleep,
                 session: requests.Session | None = None):
        self.api_url = api_url.rstrip("/")
        self.timeout = timeout
        self.deadline = time.monotonic() + budget
        self.backoff = backoff
        self.sleep = sleep
        self.session = session or requests.Session()
        self.session.headers.update({"Accept": "application/vnd.github+json",
                                     "X-GitHub-Api-Version": "2022-11-28"})
        self._token = token
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def excerpt(self, response: requests.Response) -> str:
        """The start of an answer, for an error message, with the token blanked out: a
        proxy or a misbehaving server may echo the request's credentials."""
        text = response.text
        if self._token:
            text = text.replace(self._token, "[ROTA_GITHUB_TOKEN]")
        return repr(text[:200])

    def _rate_limit_wait(self, response: requests.Response) -> float | None:
        if response.status_code not in (403, 429):
            return None
        if "Retry-After" in response.headers:
            return float(response.headers["Retry-After"])
        if response.headers.get("X-RateLimit-Remaining") == "0" and "X-RateLimit-Reset" in response.headers:
            return max(0.0, float(response.headers["X-RateLimit-Reset"]) - time.time()) + 0.5
        return None

    def _in_time(self, repository: str, needed: float) -> None:
        if time.monotonic() + needed > self.deadline:
            raise GitHubError(f"{repository}: out of time for this poll (the sensor evaluation would time "
                              "out); the next poll resumes")

    def get(self, repository: str, url: str, *, params: dict | None = None,
            headers: dict | None = None) -> requests.Response:
        """GET with retries: timeouts, connection errors and 5xx back off and retry while
        the poll's budget lasts; a rate-limit answer raises RateLimited at once."""
        for attempt in range(1, RETRIES + 1):
            self._in_time(repository, self.timeout)
            try:
                response = self.session.get(url, params=params, headers=headers, timeout=self.timeout)
            except (requests.Timeout, requests.ConnectionError) as error:
                if attempt == RETRIES:
                    raise GitHubError(f"{repository}: GitHub did not answer after {RETRIES} tries: "
                                      f"{type(error).__name__}") from None
                self._back_off(repository, attempt)
                continue
            wait = self._rate_limit_wait(response)
            if wait is not None:
                raise RateLimited(f"{repository}: rate limited by GitHub for {wait:.0f}s more; "
                                  "a later poll resumes")
            if response.status_code >= 500:
                if attempt == RETRIES:
                    raise GitHubError(f"{repository}: GitHub answered {response.status_code} "
                                      f"{RETRIES} times")
                self._back_off(repository, attempt)
                continue
            return response
        raise AssertionError("unreachable")

    def _back_off(self, repository: str, attempt: int) -> None:
        delay = self.backoff * 2 ** (attempt - 1)
        self._in_time(repository, delay + self.timeout)
        self.sleep(delay)

    def open_issues(self, repository: str, cursor: RepoCursor) -> RepoPoll:
        """Every open issue updated since the cursor, in pages keyed on `updated_at`: each
        page after the first asks `since` the newest instant the last page reached
        (inclusive, so an issue sharing that instant is not lost at a page's edge) and
        issues seen twice count once. Offset pages (`Link: rel="next"`) over an order that
        moves while they are read would skip an issue for every one updated meanwhile."""
        poll = RepoPoll(repository, RepoCursor(cursor.etag, cursor.since))
        endpoint = f"{self.api_url}/repos/{repository}/issues"
        keyed = {"state": "open", "sort": "updated", "direction": "asc", "per_page": PER_PAGE}
        if cursor.since:
            keyed["since"] = cursor.since
        url, params = endpoint, keyed
        issues: dict[int, dict] = {}
        pull_requests: set[int] = set()
        page = 0
        while True:
            page += 1
            first = page == 1
            headers = {"If-None-Match": cursor.etag} if first and cursor.etag else None
            response = self.get(repository, url, params=params, headers=headers)
            poll.requests += 1
            if first and response.status_code == 304:
                poll.not_modified = True
                return poll
            items = self._page(repository, response, page)
            for item in items:
                if "pull_request" in item:
                    pull_requests.add(item["number"])
                else:
                    issues[item["number"]] = item
            if first:
                poll.cursor.etag = response.headers.get("ETag")
            newest = max((i["updated_at"] for i in items if i.get("updated_at")), default=None)
            if len(items) < PER_PAGE or newest is None:
                break
            if newest == keyed.get("since"):
                # A whole page on one instant: keys cannot move past it, so read the rest of
                # that instant by offset.
                following = response.links.get("next", {}).get("url")
                if following is None:
                    break
                url, params = following, None
                continue
            keyed = {**keyed, "since": newest}
            url, params = endpoint, keyed
        poll.issues = list(issues.values())
        poll.pull_requests_skipped = len(pull_requests)
        updated = [i["updated_at"] for i in poll.issues if i.get("updated_at")]
        if updated:
            poll.cursor.since = max([*updated, *([cursor.since] if cursor.since else [])])
        return poll

    def _page(self, repository: str, response: requests.Response, page: int) -> list[dict]:
        if response.status_code != 200:
            raise GitHubError(f"{repository}: GitHub answered {response.status_code} on page {page}: "
                              f"{self.excerpt(response)}")
        try:
            items = response.json()
        except (json.JSONDecodeError, ValueError) as error:
            raise GitHubError(f"{repository}: malformed JSON on page {page}: {error}") from None
        if not isinstance(items, list):
            raise GitHubError(f"{repository}: page {page} is not a list of issues")
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("number"), int):
                raise GitHubError(f"{repository}: page {page} holds an entry without an issue number")
        return items


def issue_payload(repository: str, issue: dict) -> dict:
    return {"repository": repository, "number": issue["number"], "title": issue.get("title") or "",
            "url": issue.get("html_url") or ""}


_CURSORS = text(QUERIES["cursors"])
_SAVE_CURSOR = text(QUERIES["save_cursor"]).bindparams(bindparam("cursor", type_=JSONB))


def repository_cursors(engine: Engine) -> dict[str, RepoCursor]:
    """Where the last successful poll of each repository got to."""
    with engine.connect() as conn:
        return {scope: RepoCursor(**cursor) for scope, cursor in conn.execute(_CURSORS, {"source": GITHUB.name})}


def produce_issues(engine: Engine, poll: RepoPoll) -> Produced:
    """Produce one run per open issue of one repository, and move its cursor, in one
    transaction: the cursor never gets ahead of the runs, nor behind them."""
    register_job(engine, GITHUB.job_name)
    with engine.begin() as conn:
        produced = produce_many(conn, GITHUB.name, [
            (GITHUB.ref(poll.repository, issue["number"]), GITHUB.job_name, issue_payload(poll.repository, issue))
            for issue in poll.issues
        ])
        conn.execute(_SAVE_CURSOR, {"source": GITHUB.name, "scope": poll.repository,
                                    "cursor": {"etag": poll.cursor.etag, "since": poll.cursor.since}})
    return produced


@handler(GITHUB.job_name)
def handle_issue(run: ClaimedRun, engine: Engine) -> None:
    """A placeholder: a deployment registers the real triage under this job's name."""
    log.info("GitHub issue %s: %s", run.source_ref, run.payload.get("title"))


