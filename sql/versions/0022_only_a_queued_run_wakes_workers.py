"""Only a statement that queued a run wakes the workers

job_queue_wakes_workers notified `rota_runs_queued` after every INSERT statement on
job_queue, also one that inserted no row: the event sensor's pass with nothing pending
(every 15 s), a fire time or a Source's ref produced again. Each such pass woke every idle
worker to claim nothing, and its NOTIFY took a transaction id at commit, so a pass
that changed nothing still wrote a commit record. The trigger now sees the rows its
statement inserted (a transition table) and notifies only when there are some.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_FUNCTION = """
CREATE OR REPLACE FUNCTION public.job_queue_announce_runs() RETURNS trigger
LANGUAGE plpgsql SECURITY INVOKER SET search_path = pg_catalog, public, pg_temp AS $$
    BEGIN
        {body}
        RETURN NULL;
    END
    $$
"""

_ANNOUNCE_WHAT_WAS_QUEUED = """IF EXISTS (SELECT FROM queued) THEN
            PERFORM pg_notify('rota_runs_queued', '');
        END IF;"""

# 0016's body, for the downgrade.
_ANNOUNCE_EVERY_STATEMENT = "PERFORM pg_notify('rota_runs_queued', '');"


def upgrade() -> None:
    op.execute("DROP TRIGGER job_queue_wakes_workers ON public.job_queue")
    op.execute(_FUNCTION.format(body=_ANNOUNCE_WHAT_WAS_QUEUED))
    op.execute("CREATE TRIGGER job_queue_wakes_workers AFTER INSERT ON public.job_queue "
               "REFERENCING NEW TABLE AS queued FOR EACH STATEMENT EXECUTE FUNCTION public.job_queue_announce_runs()")


def downgrade() -> None:
    op.execute("DROP TRIGGER job_queue_wakes_workers ON public.job_queue")
    op.execute(_FUNCTION.format(body=_ANNOUNCE_EVERY_STATEMENT))
    op.execute("CREATE TRIGGER job_queue_wakes_workers AFTER INSERT ON public.job_queue "
               "FOR EACH STATEMENT EXECUTE FUNCTION public.job_queue_announce_runs()")
