"""dispatch_page_lock: a run tells another run's page from a tenant

A dispatch page that finds a duty row held writes its tasks and leaves the duty's mark
(last_dispatched_period) where it is; the run moves it once its pages are written. The
holder may be another run's page, which lets go within its transaction, or a tenant,
which may hold on all night: the run waits for the first and reports the second. Every
page now holds its frequency's row of this table FOR KEY SHARE for its transaction; a
run that locks the row FOR UPDATE without waiting knows no page of that frequency holds
a duty row. Pages of other frequencies hold other duties and do not keep it waiting.
It has no grants, so no tenant can lock it, unlike an advisory lock, which any role can
take.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-08
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


FREQUENCIES = ("daily", "weekly", "monthly", "quarterly", "yearly")


def upgrade() -> None:
    op.execute(f"""
        CREATE TABLE public.dispatch_page_lock (
            frequency text NOT NULL,
            CONSTRAINT dispatch_page_lock_pkey PRIMARY KEY (frequency),
            CONSTRAINT dispatch_page_lock_frequency_valid CHECK (frequency IN {FREQUENCIES})
        )""")
    op.execute(f"INSERT INTO public.dispatch_page_lock (frequency) VALUES {', '.join(f'({f!r})' for f in FREQUENCIES)}")


def downgrade() -> None:
    op.execute("DROP TABLE public.dispatch_page_lock")
