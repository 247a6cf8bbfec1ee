"""A fake GitHub REST API on 127.0.0.1 for the GitHub Source's tests: issues endpoint
with `since`, `per_page` and `Link` pagination, ETags, and scripted failures."""

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlparse


class FakeGitHub:
    def __init__(self):
        self.issues: dict[str, list[dict]] = {}
        self.script: list[dict] = []   # responses served before the real ones, in order
        self.requests: list[dict] = []
        self.missing: set[str] = set()  # repositories that answer 404
        self.failed_tick: str | None = None
        # Called after each page is served (with the repository): the world moving on
        # while a poll reads its pages.
        self.after_page: list = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.server.shutdown()
        self.server.server_close()

    def add_issues(self, repository: str, count: int, start: int = 1, pull_requests: int = 0):
        issues = self.issues.setdefault(repository, [])
        for n in range(start, start + count + pull_requests):
            issue = {"number": n, "title": f"Issue {n}", "html_url": f"https://github.test/{repository}/issues/{n}",
                     "updated_at": f"2026-11-{1 + n % 28:02d}T10:00:00Z", "state": "open"}
            if n >= start + count:
                issue["pull_request"] = {"url": "..."}
            issues.append(issue)

    def set_title(self, repository: str, number: int, title: str, updated_at: str):
        for issue in self.issues[repository]:
            if issue["number"] == number:
                issue["title"], issue["updated_at"] = title, updated_at

    def etag(self, repository: str) -> str:
        return '"' + hashlib.md5(json.dumps(self.issues.get(repository, []), sort_keys=True).encode()).hexdigest() + '"'

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, body=b"", headers=None):
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                with fake.lock:
                    fake.requests.append({"path": url.path, "query": query,
                                          "if_none_match": self.headers.get("If-None-Match"),
                                          "authorization": self.headers.get("Authorization")})
                    scripted = fake.script.pop(0) if fake.script else None
                if scripted is not None:
                    if scripted.get("delay"):
                        time.sleep(scripted["delay"])
                    headers = dict(scripted.get("headers", {}))
                    if scripted.get("reset_in") is not None:
                        headers.update({"X-RateLimit-Remaining": "0",
                                        "X-RateLimit-Reset": str(int(time.time() + scripted["reset_in"]))})
                    if "status" in scripted:
                        return self._send(scripted["status"], scripted.get("body", b"").encode()
                                          if isinstance(scripted.get("body"), str) else scripted.get("body", b""),
                                          headers)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "repos" or parts[3] != "issues":
                    return self._send(404, b'{"message": "Not Found"}')
                repository = f"{parts[1]}/{parts[2]}"
                if repository in fake.missing:
                    return self._send(404, b'{"message": "Not Found"}')
                etag = fake.etag(repository)
                if self.headers.get("If-None-Match") == etag:
                    return self._send(304, headers={"ETag": etag})
                issues = sorted(fake.issues.get(repository, []), key=lambda i: (i["updated_at"], i["number"]))
                if "since" in query:
                    issues = [i for i in issues if i["updated_at"] >= query["since"]]
                per_page, page = int(query.get("per_page", 30)), int(query.get("page", 1))
                chunk = issues[(page - 1) * per_page: page * per_page]
                headers = {"ETag": etag, "Content-Type": "application/json"}
                if page * per_page < len(issues):
                    following = {**query, "page": str(page + 1)}
                    headers["Link"] = f'<{fake.url}{url.path}?{urlencode(following)}>; rel="next"'
                self._send(200, json.dumps(chunk).encode(), headers)
                with fake.lock:
                    change = fake.after_page.pop(0) if fake.after_page else None
                if change is not None:
                    change(repository)

        return Handler
