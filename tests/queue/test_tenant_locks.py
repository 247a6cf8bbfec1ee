"""The queue never waits on a tenant's transaction (issue 37): whatever a tenant (role
rota_app) holds open, scheduled runs are queued, sources produce, events are delivered
and workers claim and finish, all while the tenant still holds it."""

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from rota.pipelines.queue.claims import complete_and_claim
from rota.pipelines.queue.enqueue import Enqueued, enqueue_scheduled, enqueue_scheduled_many
from rota.pipelines.queue.events import dispatch_pending_events
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.producing import produce_many
from tests.helpers import add_duty, run_while_held, tenant

T0 = datetime(2026, 12, 2, 3, tzinfo=timezone.utc)
BOUND = 20
# Everything a tenant may hold in one open transaction that touches what the queue reads
# or writes, or the tables beside it: reads of the queue's tables, an event it has not
# committed, its duty rows locked FOR UPDATE, its task rows updated.
TENANT_HOLDS = [
    "SELECT count(*) FROM job",
    "SELECT count(*) FROM job_queue",
    "SELECT count(*) FROM event",
    "INSERT INTO event (workspace_id, type, payload) VALUES (current_setting('rota.workspace_id')::uuid, 'ping', '{}')",
    "SELECT 1 FROM duty FOR UPDATE",
    "UPDATE task SET status = 'done'",
]


@pytest.mark.parametrize("hold", TENANT_HOLDS)
def test_the_queue_goes_on_while_a_tenant_holds_a_transaction_open(database_url, engine, hold):
    workspace = uuid.uuid4()
    add_duty(engine, workspace_id=workspace)
    hourly = register_job(engine, "hourly", schedule="0 * * * *", workspace_id=workspace)
    register_job(engine, "pinged", event_type="ping", workspace_id=workspace)
    register_job(engine, "sourced")
    assert isinstance(enqueue_scheduled(engine, hourly, T0), Enqueued)
    with engine.begin() as conn:  # a committed event of the tenant's, waiting for delivery
        conn.exec_driver_sql("INSERT INTO event (workspace_id, type, payload) VALUES (%s, 'ping', '{}')",
                             (workspace,))
    session = tenant(database_url, workspace)
    session.autocommit = False
    session.execute(hold)

    def queue_work():
        queued = enqueue_scheduled_many(engine, [(hourly, T0 + timedelta(hours=n)) for n in range(1, 4)])
        produced = produce_many(engine, "tickets", [(f"T-{n}", "sourced", {"n": n}) for n in range(3)])
        delivered = dispatch_pending_events(engine)
        recorded, claimed = complete_and_claim(engine, "worker-1", [], 100, timedelta(minutes=5))
        finished, _ = complete_and_claim(engine, "worker-1", [run.id for run in claimed], 0, timedelta(minutes=5))
        return queued, produced, delivered, claimed, finished

    queued, produced, delivered, claimed, finished = run_while_held(session, queue_work, BOUND)
    session.close()

    assert len(queued) == 3 and produced.count("created") == 3
    assert delivered == (1, 1)  # the committed event; the tenant's open one is not there yet
    # All due (the fire times are past): four scheduled, three produced, the event's one.
    assert len(claimed) == 8 and sorted(finished) == sorted(run.id for run in claimed)
