"""Loaded as a handler module (`rota worker --handlers tests.heartbeat_bug`): a bug where
the worker renews its leases, as a wrong call in rota's own code would be, while the
database is fine."""

import rota.pipelines.queue.worker


def extend_leases(*args, **kwargs):
    raise TypeError("extend_leases() takes 4 positional arguments but 5 were given")


rota.pipelines.queue.worker.extend_leases = extend_leases
