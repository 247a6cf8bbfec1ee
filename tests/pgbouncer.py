"""Debian's PgBouncer, started by a test in front of the suite's server, in transaction mode."""

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import make_url

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def pgbouncer(server_url: str, passwords: dict[str, str | None], pool_size: int = 2):
    """Yield a function turning a URL on the server into the same URL through PgBouncer.

    Clients log in without a password (trust, on 127.0.0.1 only); PgBouncer logs in to the
    server as the same user with the password given here. `pool_size` server connections
    per database and user: small, so consecutive transactions share server connections."""
    server = make_url(server_url)
    host = server.query.get("host") or server.host or "localhost"
    port = _free_port()
    # Not under pytest's tmp_path: PgBouncer may run as another user (below), who must read it.
    work = Path(tempfile.mkdtemp(prefix="rota-pgbouncer-"))
    work.chmod(0o755)
    users = work / "users.txt"
    users.write_text("".join(f'"{user}" "{password or ""}"\n' for user, password in passwords.items()))
    config = work / "pgbouncer.ini"
    config.write_text(f"""[databases]
* = host={host} port={server.port or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {users}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 200
ignore_startup_parameters = extra_float_digits,options
""")
    for path in (users, config):
        path.chmod(0o644)
    # PgBouncer refuses to run as root: it then runs as the owner of the server's socket
    # directory, who can reach the socket.
    owner = pwd.getpwuid(Path(host).stat().st_uid).pw_name if host.startswith("/") else "nobody"
    as_user = ["-u", owner] if os.geteuid() == 0 else []
    log = open(work / "pgbouncer.log", "w")
    process = subprocess.Popen([PGBOUNCER, *as_user, str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, (work / "pgbouncer.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "PgBouncer never listened"
                time.sleep(0.05)

        def through(url: str) -> str:
            return make_url(url).set(host="127.0.0.1", port=port, password=None, query={}).render_as_string(
                hide_password=False)

        yield through
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()
        shutil.rmtree(work, ignore_errors=True)
