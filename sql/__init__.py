"""Alembic migrations, shipped in the package as rota_sql."""
