"""A database's schema as one stable text, read from the catalog: what the migration test
compares between a database built from `sql/schema.sql` and one built by the migrations.

Tables with their options and partitioning, columns (type, collation, nullability,
default, identity, in order), constraints with their names and definitions, indexes,
triggers, functions, row-level security and its policies, and what `rota_app` and PUBLIC
are granted (columns and functions included). Only catalog facts that read the same on
every supported PostgreSQL are written (PostgreSQL 18's named NOT NULL constraints are
left out: nullability is in the columns), and nothing that names the role that built it."""

from sqlalchemy import Connection, text

_SECTIONS = {
    "tables": """
        SELECT c.relname || ' rls=' || c.relrowsecurity || ' forced=' || c.relforcerowsecurity
               || ' options=' || coalesce(array_to_string(c.reloptions, ','), '')
               || CASE WHEN c.relkind = 'p' THEN ' partitioned by ' || pg_get_partkeydef(c.oid) ELSE '' END
        FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND c.relname <> 'alembic_version'
          AND NOT c.relispartition
        ORDER BY 1
    """,
    "columns": """
        SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation
                       THEN ' collate ' || (SELECT collname FROM pg_collation WHERE oid = a.attcollation) ELSE '' END
               || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
               || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
               || CASE a.attidentity WHEN 'a' THEN ' identity always' WHEN 'd' THEN ' identity by default' ELSE '' END
        FROM pg_class c
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        JOIN pg_type t ON t.oid = a.atttypid
        LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND c.relname <> 'alembic_version'
          AND NOT c.relispartition
        ORDER BY c.relname, a.attnum
    """,
    "indexes": """
        SELECT pg_get_indexdef(i.indexrelid)
        FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
        WHERE c.relnamespace = 'public'::regnamespace AND NOT c.relispartition AND c.relname <> 'alembic_version'
        ORDER BY 1
    """,
    "constraints": """
        SELECT c.conrelid::regclass::text || ' ' || c.conname || ': ' || pg_get_constraintdef(c.oid)
        FROM pg_constraint c
        JOIN pg_class r ON r.oid = c.conrelid AND NOT r.relispartition
        WHERE c.connamespace = 'public'::regnamespace AND c.contype <> 'n'
          AND r.relname <> 'alembic_version'
        ORDER BY 1
    """,
    "constraint comments": """
        SELECT c.conrelid::regclass::text || ' ' || c.conname || ': ' || d.description
        FROM pg_constraint c JOIN pg_description d ON d.objoid = c.oid AND d.classoid = 'pg_constraint'::regclass
        WHERE c.connamespace = 'public'::regnamespace
        ORDER BY 1
    """,
    "triggers": """
        SELECT pg_get_triggerdef(t.oid) || CASE WHEN t.tgenabled = 'D' THEN ' [disabled]' ELSE '' END
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal AND NOT c.relispartition
        ORDER BY c.relname, t.tgname
    """,
    "functions": """
        SELECT pg_get_functiondef(p.oid)
        FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace
        ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)
    """,
    "policies": """
        SELECT tablename || ' ' || policyname || ' ' || permissive || ' ' || cmd
               || ' to ' || array_to_string(roles, ',')
               || ' using (' || coalesce(qual, '') || ') check (' || coalesce(with_check, '') || ')'
        FROM pg_policies WHERE schemaname = 'public'
        ORDER BY 1
    """,
    "table grants": """
        SELECT c.relname || ' to ' || CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END
               || ': ' || string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type)
        FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
        WHERE c.relnamespace = 'public'::regnamespace AND NOT c.relispartition
          AND (a.grantee = 0 OR pg_get_userbyid(a.grantee) = 'rota_app')
        GROUP BY c.relname, a.grantee
        ORDER BY 1
    """,
    "column grants": """
        SELECT c.relname || '.' || t.attname || ' to '
               || CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END
               || ': ' || string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type)
        FROM pg_class c JOIN pg_attribute t ON t.attrelid = c.oid
        CROSS JOIN LATERAL aclexplode(t.attacl) a
        WHERE c.relnamespace = 'public'::regnamespace AND NOT c.relispartition
          AND (a.grantee = 0 OR pg_get_userbyid(a.grantee) = 'rota_app')
        GROUP BY c.relname, t.attname, a.grantee
        ORDER BY 1
    """,
    "function grants": """
        SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') to '
               || CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END || ': ' || a.privilege_type
        FROM pg_proc p CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
        WHERE p.pronamespace = 'public'::regnamespace
          AND (a.grantee = 0 OR pg_get_userbyid(a.grantee) = 'rota_app')
        ORDER BY 1
    """,
    "schema grants": """
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END || ': ' || a.privilege_type
        FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a
        WHERE n.nspname = 'public' AND pg_get_userbyid(a.grantee) = 'rota_app'
        ORDER BY 1
    """,
}


def describe(conn: Connection) -> str:
    """The schema of `conn`'s database, one fact per line, in sections."""
    parts = []
    for title, query in _SECTIONS.items():
        rows = conn.execute(text(query)).scalars().all()
        parts.append(f"-- {title}\n" + "".join(row.rstrip() + "\n" for row in rows))
    return "\n".join(parts)
