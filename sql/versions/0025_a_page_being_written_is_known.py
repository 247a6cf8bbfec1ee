"""dispatch_page_lock: a run tells another run's page from a tenant

A dispatch page that finds a duty row held writes its tasks and leaves the duty's mark
(last_dispatched_period) where it is; the run moves it once its pages are written. The
holder may be another run's page, which lets go within its transaction, or a tenant,
which may hold on all night: the run waits for the first and reports the second. Every
page now holds this table in ROW SHARE mode for its transaction; a run that takes it in
EXCLUSIVE mode without waiting knows no page holds a duty row. It has no rows and no
grants, so no tenant can lock it, as any role can take any advisory lock.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-08
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE TABLE public.dispatch_page_lock ()")


def downgrade() -> None:
    op.execute("DROP TABLE public.dispatch_page_lock")
