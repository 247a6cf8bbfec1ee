"""The handler `rota bench` measures queue latency with: a no-op that writes how long
after its run fell due it started (see benchmarks.queue_baselines.record)."""

from benchmarks.queue_baselines import record
from pipelines.handlers import handler
from pipelines.queue import ClaimedRun


@handler("bench_latency")
def bench_latency(run: ClaimedRun, engine) -> None:
    record(run.scheduled_for.timestamp())
