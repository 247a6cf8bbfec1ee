-- The database layer's statements (resources/database): what the server says of the
-- connecting role, the database and its migration. Loaded by name
-- (rota.resources.database.queries); SQLAlchemy `text()` parameters, except where a
-- statement runs on a psycopg connection of its own (%s).

-- name: session_role
-- A superuser bypasses row-level security as BYPASSRLS does.
SELECT rolname, rolbypassrls OR rolsuper FROM pg_roles WHERE rolname = current_user;

-- name: tenant_role_makeable
-- Whether the tenants' role exists, or the migrator may make it (CREATEROLE).
SELECT current_user, EXISTS (SELECT FROM pg_roles WHERE rolname = :tenant), rolcreaterole OR rolsuper
FROM pg_roles WHERE rolname = current_user;

-- name: migrated
SELECT to_regclass('alembic_version') IS NOT NULL;

-- name: migration
SELECT version_num FROM alembic_version;

-- name: database_exists
SELECT 1 FROM pg_database WHERE datname = %s;

-- name: database_makeable
SELECT current_user, rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user;

-- name: role_exists
SELECT 1 FROM pg_roles WHERE rolname = %s;

-- name: database_owner
SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s;
