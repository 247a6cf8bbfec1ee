"""The job queue: jobs, enqueueing, event dispatch, sources' runs, claims and the worker,
and its Dagster surface (producer assets, the job_queue view, the operator's job).

SPEC §5's published names, the same objects `rota.pipelines` exports."""

from rota.pipelines.queue.enqueue import AlreadyQueued, Enqueued, enqueue_scheduled
from rota.pipelines.queue.handlers import handler
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.producing import Produced, produce, produce_many

__all__ = ["AlreadyQueued", "Enqueued", "Produced", "enqueue_scheduled", "handler", "produce", "produce_many",
           "register_job"]
