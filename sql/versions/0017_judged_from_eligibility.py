"""duty.eligible_since and job.scheduled_since: a check judges work only from when it was owed

A duty created, unpaused or re-windowed after a dispatch tick owes nothing to that tick,
and a job registered (or re-scheduled) at 14:37 owes nothing for 14:00 to 14:36. The
checks read these columns and judge a duty or a fire time only from then; nothing else
reads them, so what is dispatched or queued is unchanged.

Both are set by the database on every change that can make something newly owed, and
tenants hold no grant on them: a tenant cannot move its duties out of the checks' sight.
The owner may backdate them (an import of duties that were owed all along).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_DUTY_ELIGIBLE = r"""
CREATE FUNCTION public.duty_eligible_since_moves() RETURNS trigger
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
"""

_JOB_SCHEDULED = r"""
CREATE FUNCTION public.job_scheduled_since_moves() RETURNS trigger
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
"""


def upgrade() -> None:
    # Rows already there were judged from their creation before; they stay judged so.
    op.execute("ALTER TABLE public.duty ADD COLUMN eligible_since timestamptz")
    op.execute("UPDATE public.duty SET eligible_since = created_at")
    op.execute("ALTER TABLE public.duty ALTER COLUMN eligible_since SET DEFAULT now(), "
               "ALTER COLUMN eligible_since SET NOT NULL")
    op.execute("ALTER TABLE public.job ADD COLUMN scheduled_since timestamptz")
    op.execute("UPDATE public.job SET scheduled_since = created_at")
    op.execute("ALTER TABLE public.job ALTER COLUMN scheduled_since SET DEFAULT now(), "
               "ALTER COLUMN scheduled_since SET NOT NULL")
    op.execute(_DUTY_ELIGIBLE)
    op.execute(_JOB_SCHEDULED)
    op.execute("REVOKE EXECUTE ON FUNCTION public.duty_eligible_since_moves() FROM PUBLIC")
    op.execute("REVOKE EXECUTE ON FUNCTION public.job_scheduled_since_moves() FROM PUBLIC")
    op.execute("CREATE TRIGGER duty_eligible_since_moves BEFORE UPDATE ON public.duty "
               "FOR EACH ROW EXECUTE FUNCTION public.duty_eligible_since_moves()")
    op.execute("CREATE TRIGGER job_scheduled_since_moves BEFORE UPDATE ON public.job "
               "FOR EACH ROW EXECUTE FUNCTION public.job_scheduled_since_moves()")


def downgrade() -> None:
    op.execute("DROP TRIGGER job_scheduled_since_moves ON public.job")
    op.execute("DROP TRIGGER duty_eligible_since_moves ON public.duty")
    op.execute("DROP FUNCTION public.job_scheduled_since_moves()")
    op.execute("DROP FUNCTION public.duty_eligible_since_moves()")
    op.execute("ALTER TABLE public.job DROP COLUMN scheduled_since")
    op.execute("ALTER TABLE public.duty DROP COLUMN eligible_since")
