"""Benchmark data, built inside PostgreSQL (one statement per table)."""

from sqlalchemy import Engine, text

from rota.pipelines.cli.demo import ZONES

# Frequency mix: every frequency, weighted so a million duties make about three million tasks.
MIX = [("daily", 10), ("weekly", 20), ("monthly", 40), ("quarterly", 15), ("yearly", 15)]


def load_duties(engine: Engine, count: int, frequencies: list[tuple[str, int]] = MIX, max_lead: int = 30,
                zones: list[str] = ZONES, workspaces: int = 97) -> None:
    """`count` active recurring duties over the demo's zones, leads 0..max_lead, owed
    all along: the checks judge them at the benchmarks' instants, which precede the load.
    Duty n belongs to workspace (n % workspaces) + 1 (workspace_of)."""
    buckets = []
    for frequency, weight in frequencies:
        buckets += [frequency] * weight
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE task, duty RESTART IDENTITY CASCADE"))
        conn.execute(text(
            """
            INSERT INTO duty (workspace_id, title, kind, frequency, timezone, lead_days, state, eligible_since)
            SELECT ('00000000-0000-0000-0000-' || lpad(((n % CAST(:workspaces AS int)) + 1)::text, 12, '0'))::uuid,
                   'duty ' || n, 'recurring', (CAST(:buckets AS text[]))[1 + (n * 7919) % cardinality(CAST(:buckets AS text[]))],
                   (CAST(:zones AS text[]))[1 + (n * 104729) % cardinality(CAST(:zones AS text[]))],
                   (n * 31337) % (CAST(:max_lead AS int) + 1), 'active', '-infinity'
            FROM generate_series(1::bigint, :count) AS n
            """
        ), {"buckets": buckets, "zones": zones, "max_lead": max_lead, "count": count, "workspaces": workspaces})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM (ANALYZE) duty"))


def workspace_of(duty_id: int, workspaces: int = 97) -> str:
    return f"00000000-0000-0000-0000-{duty_id % workspaces + 1:012d}"


def reset_dispatch(engine: Engine) -> None:
    """Back to before the first dispatch: no tasks, nothing dispatched, nothing dirty."""
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE task RESTART IDENTITY"))
        conn.execute(text("UPDATE duty SET last_dispatched_period = NULL WHERE last_dispatched_period IS NOT NULL"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM (ANALYZE) duty"))
    settle(engine)


def settle(engine: Engine) -> None:
    """A checkpoint, so a timed write starts with nothing dirty that an earlier one left,
    and pays a full-page image for each page it touches first, as every side does."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("CHECKPOINT"))
