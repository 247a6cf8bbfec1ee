"""The baseline queue for `queue_throughput`: procrastinate with a no-op task."""

import os

import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_CONNINFO", "")))


@app.task(name="noop")
def noop() -> None:
    return None
