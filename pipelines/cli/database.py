"""The database a command works on: ROTA_DATABASE_URL's, or the embedded one."""

import os

from rota.resources.database.server import (
    database_name,
    embedded_datadir,
    embedded_running,
    embedded_rota_url,
    ensure_database,
    stop_embedded,
)


def say(message: str) -> None:
    print(f"rota: {message}", flush=True)


class Database:
    """The database rota uses, and whether this command started the embedded server (which
    it then stops again, also when it fails)."""

    def __init__(self) -> None:
        self.url = os.environ.get("ROTA_DATABASE_URL")
        self.embedded = not self.url
        self.started_embedded = False
        try:
            if self.embedded:
                datadir = embedded_datadir()
                self.started_embedded = not embedded_running(datadir)
                self.url, made = embedded_rota_url(datadir)
                say(f"embedded PostgreSQL in {datadir}")
            else:
                made = [database_name(self.url)] if ensure_database(self.url) else []
            for name in made:
                say(f"created the database {name}")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.started_embedded:
            stop_embedded(embedded_datadir())
            say("stopped the embedded PostgreSQL")
