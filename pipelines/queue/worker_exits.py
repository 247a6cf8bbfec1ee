"""How a worker ends when it must not go on: the statuses a supervisor tells apart, and
which failures of the database may pass."""

import logging
import os

import psycopg
from psycopg import OperationalError as DriverOperationalError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

# A lost database surfaces through SQLAlchemy, or through a raw psycopg cursor.
DATABASE_GONE = (OperationalError, DriverOperationalError)


def may_pass(error: Exception) -> bool:
    """A renewal that failed for a reason that may pass: the database gone, no connection
    free in the pool, a connection found closed or invalidated. Anything else is a bug."""
    return (isinstance(error, (*DATABASE_GONE, PoolTimeout, InterfaceError, psycopg.InterfaceError))
            or (isinstance(error, DBAPIError) and error.connection_invalidated))


# The exit status of a worker that stopped its handler because it could no longer prove
# it held the run's lease (EX_TEMPFAIL: run it again).
LEASE_LOST_EXIT = 75
# The exit status of a worker stopped by a bug in its own lease keeping (EX_SOFTWARE): not a
# lost lease, and restarting it brings the same bug back, so a supervisor and an operator
# must be able to tell the two apart.
BUG_EXIT = 70


def exit_lease_lost() -> None:
    logging.shutdown()
    os._exit(LEASE_LOST_EXIT)


def exit_for_bug() -> None:
    logging.shutdown()
    os._exit(BUG_EXIT)
