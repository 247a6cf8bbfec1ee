"""The procrastinate baseline of `python -m benchmarks`: a no-op task (see queue_baselines)."""

import os

import procrastinate

from benchmarks.queue_baselines import record

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_CONNINFO", "")))


@app.task(name="noop")
def noop(due: float | None = None) -> None:
    record(due)
