"""`rota psql` hands rota's URL to psql as libpq's environment, so psql's own options win."""

import pytest

from rota.resources.database.server import Refused, libpq_environment


def test_the_url_becomes_libpqs_variables_and_replaces_only_the_callers_target():
    inherited = {"PATH": "/bin", "PGHOST": "elsewhere", "PGSERVICE": "other", "PGTZ": "Asia/Kathmandu"}
    env = libpq_environment("postgresql://rota_owner:secret@db.example:6432/rota?sslmode=verify-full"
                            "&sslrootcert=/ca.pem&application_name=rota", inherited)
    assert env == {"PATH": "/bin", "PGTZ": "Asia/Kathmandu", "PGHOST": "db.example", "PGPORT": "6432",
                   "PGUSER": "rota_owner", "PGPASSWORD": "secret", "PGDATABASE": "rota", "PGSSLMODE": "verify-full",
                   "PGSSLROOTCERT": "/ca.pem", "PGAPPNAME": "rota"}


def test_a_socket_directory_is_the_host():
    env = libpq_environment("postgresql://rota_owner@/rota?host=/run/rota", {})
    assert env == {"PGHOST": "/run/rota", "PGUSER": "rota_owner", "PGDATABASE": "rota"}


def test_a_parameter_libpq_reads_from_no_variable_is_refused_by_name():
    with pytest.raises(Refused, match="keepalives"):
        libpq_environment("postgresql://rota_owner@/rota?host=/run/rota&keepalives=1", {})
