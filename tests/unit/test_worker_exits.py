"""Which failures of a lease renewal the worker waits out, and which it stops for as a bug
(exit 70, not a lost lease's 75)."""

import psycopg
import pytest
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from rota.pipelines.queue.worker_exits import may_pass


@pytest.mark.parametrize("error", [
    OperationalError("SELECT 1", {}, Exception("server closed the connection")),
    psycopg.OperationalError("connection refused"),
    PoolTimeout("QueuePool limit of size 3 overflow 2 reached"),
    InterfaceError("SELECT 1", {}, Exception("connection already closed")),
    psycopg.InterfaceError("the connection is closed"),
    DBAPIError("SELECT 1", {}, Exception("terminating connection"), connection_invalidated=True),
], ids=lambda error: type(error).__name__)
def test_the_database_away_a_full_pool_or_a_closed_connection_may_pass(error):
    assert may_pass(error)


@pytest.mark.parametrize("error", [
    TypeError("extend_leases() takes 4 positional arguments"),
    DBAPIError("SELECT 1", {}, Exception("syntax error")),
    psycopg.errors.UndefinedColumn("column lease_until does not exist"),
], ids=lambda error: type(error).__name__)
def test_anything_else_is_a_bug(error):
    assert not may_pass(error)
