"""The job queue: jobs, enqueueing, event dispatch, sources' runs, claims and the worker,
and its Dagster surface (producer assets, the job_queue view, the operator's job).

The names below are rota's published interface (SPEC §5, and the README's example)."""

from rota.pipelines.queue.enqueue import AlreadyQueued, Enqueued, enqueue_scheduled
from rota.pipelines.queue.jobs import register_job

__all__ = ["AlreadyQueued", "Enqueued", "enqueue_scheduled", "register_job"]
