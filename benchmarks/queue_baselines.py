"""The queues `python -m benchmarks` races rota's against: pgqueuer, Oban for Python and
procrastinate, each with a no-op job. Runs in a virtualenv of its own (`python -m benchmarks`
builds it; Oban needs Python 3.12), never in rota's:

    python -m benchmarks.queue_baselines QUEUE install
    python -m benchmarks.queue_baselines QUEUE enqueue N      N jobs due now, in batches
    python -m benchmarks.queue_baselines QUEUE work           one worker, until SIGTERM
    python -m benchmarks.queue_baselines QUEUE produce N RATE N jobs, one every 1/RATE s

The database comes from BENCH_CONNINFO. Every job carries the instant it fell due; a
worker started with BENCH_LATENCY_DIR set writes, per job, the seconds from then to the
start of its handler."""

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import psycopg

CONNINFO = os.environ.get("BENCH_CONNINFO", "")
BATCH = 10_000
# Jobs each worker executes at once, for every queue: Oban's queue limit, pgqueuer's batch,
# rota's and procrastinate's --concurrency.
CONCURRENCY = 10
_latencies = None


def record(due: float | None) -> None:
    global _latencies
    if due is None or not os.environ.get("BENCH_LATENCY_DIR"):
        return
    if _latencies is None:
        _latencies = open(Path(os.environ["BENCH_LATENCY_DIR"]) / f"{os.getpid()}.txt", "a", buffering=1)
    _latencies.write(f"{time.time() - due}\n")


async def _until_stopped() -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()


async def pgqueuer_factory():
    from pgqueuer import PgQueuer
    from pgqueuer.db import PsycopgDriver

    connection = await psycopg.AsyncConnection.connect(CONNINFO, autocommit=True)
    pgq = PgQueuer(PsycopgDriver(connection))

    @pgq.entrypoint("noop")
    async def noop(job) -> None:
        record(float(job.payload) if job.payload else None)

    return pgq


async def _pgqueuer_work() -> None:
    """As `pgq run` does (its 1.6.0 CLI fails on its own log-level default): with its
    defaults, until SIGTERM sets the shutdown event it listens to."""
    pgq = await pgqueuer_factory()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, pgq.shutdown.set)
    await pgq.run(batch_size=CONCURRENCY)


async def _pgqueuer_enqueue(count: int, due: bool) -> None:
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.queries import Queries

    async with await psycopg.AsyncConnection.connect(CONNINFO, autocommit=True) as connection:
        queries = Queries(PsycopgDriver(connection))
        for start in range(0, count, BATCH):
            n = min(BATCH, count - start)
            payload = str(time.time()).encode() if due else None
            await queries.enqueue(["noop"] * n, [payload] * n, [0] * n)


async def _pgqueuer_install() -> None:
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.queries import Queries

    async with await psycopg.AsyncConnection.connect(CONNINFO, autocommit=True) as connection:
        await Queries(PsycopgDriver(connection)).install()


def _oban_worker():
    from oban import worker

    @worker(queue="default")
    class Noop:
        async def process(self, job) -> None:
            record(job.args.get("due"))

    return Noop


async def _oban_pool():
    from oban import Oban

    return await Oban.create_pool(dsn=CONNINFO, min_size=1, max_size=4)


async def _oban_enqueue(count: int, due: bool) -> None:
    from oban import Oban

    noop = _oban_worker()
    pool = await _oban_pool()
    try:
        async with Oban(pool=pool) as oban:
            for start in range(0, count, BATCH):
                args = {"due": time.time()} if due else {}
                await oban.enqueue_many([noop.new(args) for _ in range(min(BATCH, count - start))])
    finally:
        await pool.close()


async def _oban_work() -> None:
    from oban import Oban

    _oban_worker()
    pool = await _oban_pool()
    try:
        async with Oban(pool=pool, queues={"default": CONCURRENCY}):
            await _until_stopped()
    finally:
        await pool.close()


async def _oban_install() -> None:
    from oban.schema import install as install_schema

    pool = await _oban_pool()
    try:
        await install_schema(pool)
    finally:
        await pool.close()


def _procrastinate_enqueue(count: int, due: bool) -> None:
    from benchmarks.procrastinate_app import app, noop

    with app.open():
        for start in range(0, count, BATCH):
            args = {"due": time.time()} if due else {}
            noop.batch_defer(*[args] * min(BATCH, count - start))


def _procrastinate_install() -> None:
    from benchmarks.procrastinate_app import app

    with app.open():
        app.schema_manager.apply_schema()


def enqueue(queue: str, count: int, due: bool = False) -> None:
    if queue == "pgqueuer":
        asyncio.run(_pgqueuer_enqueue(count, due))
    elif queue == "oban":
        asyncio.run(_oban_enqueue(count, due))
    else:
        _procrastinate_enqueue(count, due)


async def _paced(count: int, rate: float, send) -> None:
    started = time.monotonic()
    for n in range(count):
        await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
        await send(time.time())


async def _produce(queue: str, count: int, rate: float) -> None:
    """One job at a time on one connection, each due as it is enqueued, `rate` a second."""
    if queue == "pgqueuer":
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.queries import Queries

        async with await psycopg.AsyncConnection.connect(CONNINFO, autocommit=True) as connection:
            queries = Queries(PsycopgDriver(connection))
            await _paced(count, rate, lambda due: queries.enqueue("noop", str(due).encode()))
    elif queue == "oban":
        from oban import Oban

        noop = _oban_worker()
        pool = await _oban_pool()
        try:
            async with Oban(pool=pool) as oban:
                await _paced(count, rate, lambda due: oban.enqueue(noop.new({"due": due})))
        finally:
            await pool.close()
    else:
        from benchmarks.procrastinate_app import app, noop

        async with app.open_async():
            await _paced(count, rate, lambda due: noop.defer_async(due=due))


def main(argv: list[str]) -> None:
    queue, command, *args = argv
    if command == "install":
        {"pgqueuer": lambda: asyncio.run(_pgqueuer_install()), "oban": lambda: asyncio.run(_oban_install()),
         "procrastinate": _procrastinate_install}[queue]()
    elif command == "enqueue":
        enqueue(queue, int(args[0]))
    elif command == "produce":
        asyncio.run(_produce(queue, int(args[0]), float(args[1])))
    elif command == "work" and queue in ("oban", "pgqueuer"):
        asyncio.run({"oban": _oban_work, "pgqueuer": _pgqueuer_work}[queue]())
    else:
        raise SystemExit(f"unknown: {queue} {command}")


if __name__ == "__main__":
    main(sys.argv[1:])
