"""A worker's settings and its default identity, as `rota worker` and the tests make them."""

import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import timedelta


@dataclass
class WorkerSettings:
    """What `rota worker` takes as options: a field with a `flag` is one (resources/settings.py),
    its default and help shown by `rota worker --help`."""

    lease: timedelta = field(default=timedelta(seconds=30),
                             metadata={"flag": "--lease", "help": "lease length in seconds"})
    grace: timedelta = field(default=timedelta(seconds=20),
                             metadata={"flag": "--grace", "help": "seconds to finish after SIGTERM"})
    poll_interval: float = field(default=0.5, metadata={"flag": "--poll", "help": "seconds between empty polls"})
    # Wake on the NOTIFY of newly queued runs instead of only polling: a run queued for
    # now starts in milliseconds, not up to poll_interval later. Polling stays, so a lost
    # notification (a PgBouncer in transaction mode delivers none) costs latency only.
    listen: bool = field(default=True, metadata={
        "flag": "--no-listen",
        "help": "poll only; do not LISTEN for queued runs (needed behind PgBouncer in transaction mode)"})
    backoff: timedelta = field(default=timedelta(seconds=5),
                               metadata={"flag": "--backoff", "help": "first retry delay in seconds"})
    concurrency: int = field(default=1, metadata={
        "flag": "--concurrency", "help": "runs executed at once, each on a thread of its own", "ge": 1})
    backoff_cap: timedelta = timedelta(hours=1)
    reclaim_interval: float = 5.0
    # Past the grace period, the run in hand is reclaimable this long after the worker left.
    interrupted_lease: timedelta = timedelta(seconds=3)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
