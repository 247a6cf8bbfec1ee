"""Row-level security for tenant tables, as the migrations apply it.

Migrations replay this code, so it is frozen: a different policy is a new function
used by a new migration, never an edit here."""

from alembic import op

# Tenant sessions connect as this role and set rota.workspace_id; an unset or reset
# setting reads as NULL, which equals nothing, so such a session sees no row at all.
CURRENT_WORKSPACE = "NULLIF(current_setting('rota.workspace_id', true), '')::uuid"


def enable_tenant_isolation(table: str) -> None:
    op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY {table}_workspace_isolation ON {table} "
        f"USING (workspace_id = {CURRENT_WORKSPACE}) "
        f"WITH CHECK (workspace_id = {CURRENT_WORKSPACE})"
    )
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO rota_app")


