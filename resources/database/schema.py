"""rota's tables as SQLAlchemy Core, for the queries that build statements from them. The
schema to read is `sql/schema.sql`; the drift check (`alembic check`, run by the migration
tests) holds these tables to what the migrations build."""

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Date,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

FREQUENCIES = ("daily", "weekly", "monthly", "quarterly", "yearly")
DUTY_KINDS = ("recurring", "standing")
DUTY_STATES = ("active", "paused", "archived")
TASK_STATUSES = ("open", "done", "skipped")
RUN_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
MAX_ATTEMPTS_LIMIT = 100
# Five whitespace-separated fields of cron characters; croniter checks the meaning when a
# job is registered through rota, this shape check catches what bypasses it.
CRON_SHAPE = r"^\s*[0-9A-Za-z*/,?#-]+(\s+[0-9A-Za-z*/,?#-]+){4}\s*$"
MAX_LEAD_DAYS = 366
MAX_TITLE_LENGTH = 500
MAX_REF_LENGTH = 1000

metadata = MetaData(
    naming_convention={
        "ix": "%(table_name)s_%(column_0_N_name)s_idx",
        "uq": "%(table_name)s_%(column_0_N_name)s_key",
        "ck": "%(table_name)s_%(constraint_name)s",
        "fk": "%(table_name)s_%(column_0_name)s_fkey",
        "pk": "%(table_name)s_pkey",
    }
)


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _table_keyed_by_id(name: str, *items, **options) -> Table:
    """A table whose key is an `id` PostgreSQL generates: always, so no writer chooses one."""
    key = Column("id", BigInteger, Identity(always=True), primary_key=True)
    return Table(name, metadata, key, *items, **options)


def _workspace_id(*, nullable: bool) -> Column:
    return Column("workspace_id", UUID(as_uuid=True), nullable=nullable)


def _timestamps() -> list[Column]:
    return [
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    ]


# Names a zone only if both PostgreSQL and Python's zoneinfo know it: a duty's periods
# are computed in Python and compared in SQL, so a zone only one side knows (PostgreSQL
# alone accepts POSIX strings such as 'UTC+3', with the sign inverted) would plan wrongly.
# Filled by the migration; a foreign key makes every write check it at insert speed.
iana_timezone = Table(
    "iana_timezone",
    metadata,
    Column("name", Text, primary_key=True),
)

duty = _table_keyed_by_id(
    "duty",
    _workspace_id(nullable=False),
    Column("title", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("frequency", Text, nullable=True),
    Column("timezone", Text, nullable=False),
    Column("lead_days", Integer, nullable=False, server_default=text("0")),
    Column("effective_from", Date, nullable=True),
    Column("effective_to", Date, nullable=True),
    Column("state", Text, nullable=False, server_default=text("'active'")),
    Column("last_dispatched_period", Text, nullable=True),
    *_timestamps(),
    # When the duty last became owed something new (created, unpaused, re-windowed): the
    # checks judge it only from then. Moved by migration 0017's trigger; tenants may not write it.
    Column("eligible_since", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # The span a scheduled run proved complete: every period whose key lies in it and whose
    # due date lies in the window has a task. Migration 0007's triggers clear it whenever
    # that could stop being true; a scheduled run skips a duty whose span covers its work.
    Column("complete_from", Text, nullable=True),
    Column("complete_through", Text, nullable=True),
    CheckConstraint(_one_of("kind", DUTY_KINDS), name="kind_valid"),
    CheckConstraint(_one_of("frequency", FREQUENCIES), name="frequency_valid"),
    CheckConstraint("(kind = 'standing') = (frequency IS NULL)", name="frequency_matches_kind"),
    CheckConstraint(_one_of("state", DUTY_STATES), name="state_valid"),
    CheckConstraint(f"lead_days BETWEEN 0 AND {MAX_LEAD_DAYS}", name="lead_days_range"),
    CheckConstraint(
        "effective_from IS NULL OR effective_to IS NULL OR effective_from <= effective_to",
        name="effective_window_ordered",
    ),
    CheckConstraint(f"char_length(title) BETWEEN 1 AND {MAX_TITLE_LENGTH}", name="title_length"),
    CheckConstraint("(complete_from IS NULL) = (complete_through IS NULL)", name="complete_span_whole"),
    ForeignKeyConstraint(["timezone"], [iana_timezone.c.name], name="duty_timezone_known"),
    # What task_duty_fkey checks against: a task always lives in its duty's workspace.
    UniqueConstraint("id", "workspace_id", name="duty_id_workspace_key"),
    # The dispatcher reads one frequency's duties in keyset pages on id.
    Index("duty_dispatch_scan_idx", "frequency", "id"),
)

task = Table(
    "task",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("duty_id", BigInteger, nullable=False),
    _workspace_id(nullable=False),
    # Byte order: every key of one year sorts between 'YYYY' and 'YYYY~', and a partition's
    # range holds exactly the keys it names (migration 0009).
    Column("period_key", Text(collation="C"), primary_key=True),
    Column("period_start", Date, nullable=False),
    Column("due_date", Date, nullable=False),
    Column("visible_from", Date, nullable=False),
    Column("status", Text, nullable=False, server_default=text("'open'")),
    *_timestamps(),
    # The identity of dispatched work: producing a task is an insert that may conflict here.
    UniqueConstraint("duty_id", "period_key", name="task_dispatch_identity"),
    CheckConstraint(_one_of("status", TASK_STATUSES), name="status_valid"),
    CheckConstraint(
        "period_start <= due_date AND visible_from <= due_date", name="period_ordered"
    ),
    # A night's tasks land in the few partitions its keys name, whatever the history.
    # Partitions are made by rota_ensure_task_partitions (migration 0009) before a write.
    postgresql_partition_by="RANGE (period_key)",
)
# task (duty_id, workspace_id) -> duty (id, workspace_id) is enforced by triggers under the
# name task_duty_fkey (sql/schema.sql): a row trigger on insert that a dispatch page's own
# rows skip, and triggers on duty for delete, move and truncate. A foreign key checked
# every inserted row with a query of its own and cost more than the insert.

job = _table_keyed_by_id(
    "job",
    Column("name", Text, nullable=False),
    _workspace_id(nullable=True),
    Column("schedule", Text, nullable=True),
    Column("timezone", Text, nullable=False, server_default=text("'UTC'")),
    Column("event_type", Text, nullable=True),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("max_attempts", Integer, nullable=False, server_default=text("5")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # When its fire times became owed (registered, re-enabled, re-scheduled): migration 0017.
    Column("scheduled_since", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("name", name="job_name_key"),
    CheckConstraint(f"schedule ~ '{CRON_SHAPE}'", name="schedule_cron_shape"),
    CheckConstraint(f"max_attempts BETWEEN 1 AND {MAX_ATTEMPTS_LIMIT}", name="max_attempts_range"),
    CheckConstraint("char_length(name) BETWEEN 1 AND 200", name="name_length"),
    ForeignKeyConstraint(["timezone"], [iana_timezone.c.name], name="job_timezone_known"),
)

event = _table_keyed_by_id(
    "event",
    _workspace_id(nullable=True),
    Column("type", Text, nullable=False),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("occurred_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # When the event sensor queued the event's runs; NULL until then. The sensor takes
    # every event without one, so delivery does not depend on when its transaction committed.
    Column("dispatched_at", DateTime(timezone=True), nullable=True),
    Index("event_dispatch_pending_idx", "dispatched_at", "id"),
)

# One row per run. Every run has exactly one origin, and each origin has its own identity
# constraint. PostgreSQL treats NULLs as distinct, so each constraint binds only rows of
# its own origin: the three are complementary parts of one idea (producing is an insert
# whose conflict is an expected outcome), not the same mechanism three times.
job_queue = _table_keyed_by_id(
    "job_queue",
    Column("job_id", BigInteger, ForeignKey(job.c.id, name="job_queue_job_id_fkey"), nullable=False),
    _workspace_id(nullable=True),
    Column("event_id", BigInteger, ForeignKey(event.c.id, name="job_queue_event_id_fkey"), nullable=True),
    Column("scheduled_for", DateTime(timezone=True), nullable=True),
    Column("source", Text, nullable=True),
    Column("source_ref", Text, nullable=True),
    Column("state", Text, nullable=False, server_default=text("'queued'")),
    Column("run_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("lease_owner", Text, nullable=True),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("last_error", Text, nullable=True),
    *_timestamps(),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    # When the latest attempt was claimed; and an operator's latest action from Dagster,
    # when, and by which Dagster run (migration 0018).
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("operator_action", Text, nullable=True),
    Column("operator_action_at", DateTime(timezone=True), nullable=True),
    Column("operator_run_id", Text, nullable=True),
    # When its schedule stopped firing at its fire time: a cron edit's cancel, undone by
    # queueing it again if the fire time is owed again (migration 0023).
    Column("unscheduled_at", DateTime(timezone=True), nullable=True),
    UniqueConstraint("job_id", "scheduled_for", name="job_queue_schedule_identity"),
    UniqueConstraint("event_id", "job_id", name="job_queue_event_identity"),
    UniqueConstraint("source", "source_ref", name="job_queue_source_identity"),
    CheckConstraint("num_nonnulls(scheduled_for, event_id, source_ref) = 1", name="one_origin"),
    CheckConstraint("(source IS NULL) = (source_ref IS NULL)", name="source_has_ref"),
    CheckConstraint(f"char_length(source_ref) BETWEEN 1 AND {MAX_REF_LENGTH}", name="source_ref_length"),
    CheckConstraint(_one_of("state", RUN_STATES), name="state_valid"),
    CheckConstraint(
        "(state = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)",
        name="lease_matches_state",
    ),
    CheckConstraint("attempts >= 0", name="attempts_non_negative"),
    CheckConstraint("operator_action IN ('retried', 'cancelled')", name="operator_action_valid"),
    CheckConstraint("(operator_action IS NULL) = (operator_action_at IS NULL) "
                    "AND (operator_action IS NULL) = (operator_run_id IS NULL)", name="operator_action_recorded"),
    CheckConstraint("unscheduled_at IS NULL OR state = 'cancelled'", name="unscheduled_is_cancelled"),
    # Claiming reads queued rows in run_at order.
    Index("job_queue_claim_idx", "state", "run_at"),
    # Producers ask it whether a fire time they offer has a run its schedule cancelled.
    Index("job_queue_unscheduled_idx", "job_id", "scheduled_for", postgresql_where=text("unscheduled_at IS NOT NULL")),
)

# A lock per frequency, which every dispatch page holds (sql/schema.sql says how).
dispatch_page_lock = Table(
    "dispatch_page_lock",
    metadata,
    Column("frequency", Text, primary_key=True),
    CheckConstraint(_one_of("frequency", FREQUENCIES), name="frequency_valid"),
)

# Where a Source's poll of one scope (a GitHub repository) got to, written in the same
# transaction as the runs that poll produced.
source_cursor = Table(
    "source_cursor",
    metadata,
    Column("source", Text, primary_key=True),
    Column("scope", Text, primary_key=True),
    Column("cursor", JSONB, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# One row: the instant this database's rota history starts (migration 0015), where task's
# partitions begin (`rota history-start` moves it), and the install (migration 0020), where
# the queue's and maintenance's begin (nothing moves it).
rota_history = Table(
    "rota_history",
    metadata,
    Column("one_row", Boolean, primary_key=True, server_default=text("true")),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("installed_at", DateTime(timezone=True), nullable=False),
    CheckConstraint("one_row", name="one_row"),
)
