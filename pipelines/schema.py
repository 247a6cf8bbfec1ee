"""rota's tables, as SQLAlchemy Core. The migrations in `sql/` build the same schema;
the drift check (`alembic check`, run by the tests) proves the two agree."""

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
from sqlalchemy.dialects.postgresql import UUID

FREQUENCIES = ("daily", "weekly", "monthly", "quarterly", "yearly")
DUTY_KINDS = ("recurring", "standing")
DUTY_STATES = ("active", "paused", "archived")
TASK_STATUSES = ("open", "done", "skipped")
MAX_LEAD_DAYS = 366
MAX_TITLE_LENGTH = 500

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

duty = Table(
    "duty",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("workspace_id", UUID(as_uuid=True), nullable=False),
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
    ForeignKeyConstraint(["timezone"], [iana_timezone.c.name], name="duty_timezone_known"),
    # The target of task's composite key: a task always lives in its duty's workspace.
    UniqueConstraint("id", "workspace_id", name="duty_id_workspace_key"),
    # The dispatcher reads one frequency's duties in keyset pages on id.
    Index("duty_dispatch_scan_idx", "frequency", "id"),
)

task = Table(
    "task",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("duty_id", BigInteger, nullable=False),
    Column("workspace_id", UUID(as_uuid=True), nullable=False),
    Column("period_key", Text, nullable=False),
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
    ForeignKeyConstraint(
        ["duty_id", "workspace_id"],
        [duty.c.id, duty.c.workspace_id],
        name="task_duty_fkey",
    ),
)

TENANT_TABLES = ("duty", "task")
