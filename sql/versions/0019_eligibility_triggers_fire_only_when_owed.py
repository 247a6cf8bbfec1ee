"""The eligibility triggers fire only for a change that can make something newly owed

duty_eligible_since_moves and job_scheduled_since_moves ran a PL/pgSQL function for every
updated row, and the function itself decided whether to move the column. The decision is
now the trigger's WHEN clause, which PostgreSQL evaluates without calling a function, and
the function only moves the column. What moves it is unchanged. The dispatcher updates
the marks of every duty it gives a task, a million rows on a large night: the function call
was a quarter of that UPDATE's time (docs/perf.md, issue 37).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_DUTY_OWES_MORE = """
    NEW.eligible_since IS NOT DISTINCT FROM OLD.eligible_since
    AND ((NEW.state = 'active' AND OLD.state IS DISTINCT FROM 'active')
         OR NEW.kind IS DISTINCT FROM OLD.kind
         OR NEW.frequency IS DISTINCT FROM OLD.frequency
         OR NEW.timezone IS DISTINCT FROM OLD.timezone
         OR NEW.lead_days > OLD.lead_days
         OR (OLD.effective_from IS NOT NULL AND (NEW.effective_from IS NULL OR NEW.effective_from < OLD.effective_from))
         OR (OLD.effective_to IS NOT NULL AND (NEW.effective_to IS NULL OR NEW.effective_to > OLD.effective_to)))
"""

_JOB_OWES_MORE = """
    NEW.scheduled_since IS NOT DISTINCT FROM OLD.scheduled_since
    AND ((NEW.enabled AND NOT OLD.enabled)
         OR NEW.schedule IS DISTINCT FROM OLD.schedule
         OR NEW.timezone IS DISTINCT FROM OLD.timezone)
"""

_MOVES = """
CREATE OR REPLACE FUNCTION public.{function}() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    NEW.{column} := now();
    RETURN NEW;
END
$$
"""

# 0017's functions, as they stood, for the downgrade.
_DECIDES = {
    "duty_eligible_since_moves": """
CREATE OR REPLACE FUNCTION public.duty_eligible_since_moves() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF NEW.eligible_since IS DISTINCT FROM OLD.eligible_since THEN
        RETURN NEW;  -- set on purpose, by a role that may
    END IF;
    IF (NEW.state = 'active' AND OLD.state IS DISTINCT FROM 'active')
       OR NEW.kind IS DISTINCT FROM OLD.kind
       OR NEW.frequency IS DISTINCT FROM OLD.frequency
       OR NEW.timezone IS DISTINCT FROM OLD.timezone
       OR NEW.lead_days > OLD.lead_days
       OR (OLD.effective_from IS NOT NULL AND (NEW.effective_from IS NULL OR NEW.effective_from < OLD.effective_from))
       OR (OLD.effective_to IS NOT NULL AND (NEW.effective_to IS NULL OR NEW.effective_to > OLD.effective_to))
    THEN
        NEW.eligible_since := now();
    END IF;
    RETURN NEW;
END
$$
""",
    "job_scheduled_since_moves": """
CREATE OR REPLACE FUNCTION public.job_scheduled_since_moves() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF NEW.scheduled_since IS DISTINCT FROM OLD.scheduled_since THEN
        RETURN NEW;
    END IF;
    IF (NEW.enabled AND NOT OLD.enabled)
       OR NEW.schedule IS DISTINCT FROM OLD.schedule
       OR NEW.timezone IS DISTINCT FROM OLD.timezone
    THEN
        NEW.scheduled_since := now();
    END IF;
    RETURN NEW;
END
$$
""",
}

_TRIGGERS = [("duty", "duty_eligible_since_moves", "eligible_since", _DUTY_OWES_MORE),
             ("job", "job_scheduled_since_moves", "scheduled_since", _JOB_OWES_MORE)]


def upgrade() -> None:
    for table, name, column, when in _TRIGGERS:
        op.execute(_MOVES.format(function=name, column=column))
        op.execute(f"DROP TRIGGER {name} ON public.{table}")
        op.execute(f"CREATE TRIGGER {name} BEFORE UPDATE ON public.{table} FOR EACH ROW WHEN ({when}) "
                   f"EXECUTE FUNCTION public.{name}()")


def downgrade() -> None:
    for table, name, _, _ in _TRIGGERS:
        op.execute(_DECIDES[name])
        op.execute(f"DROP TRIGGER {name} ON public.{table}")
        op.execute(f"CREATE TRIGGER {name} BEFORE UPDATE ON public.{table} FOR EACH ROW "
                   f"EXECUTE FUNCTION public.{name}()")
