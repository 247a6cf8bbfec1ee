"""The transaction a queue call runs in.

`conn` is a SQLAlchemy Engine or Connection. With an Engine, or a Connection not inside
a transaction, each call commits its own transaction; inside the caller's transaction
it takes part in it and the caller commits."""

from contextlib import contextmanager
from typing import Iterator

from sqlalchemy import Connection, Engine


@contextmanager
def transaction(conn: Connection | Engine) -> Iterator[Connection]:
    if isinstance(conn, Engine):
        with conn.begin() as connection:
            yield connection
    elif conn.in_transaction():
        yield conn
    else:
        with conn.begin():
            yield conn
