"""The handler registry: a job's runs are executed by the handler registered under the
job's name. A handler is a plain callable taking the claimed run and rota's engine."""

import importlib
import logging
from typing import Callable

from sqlalchemy import Engine

from rota.pipelines.queue.claims import ClaimedRun

Handler = Callable[[ClaimedRun, Engine], None]
HANDLERS: dict[str, Handler] = {}
# Modules whose handlers every worker has: the Sources' own jobs.
BUILTIN_HANDLER_MODULES = ["rota.pipelines.sources.nightly", "rota.pipelines.sources.github"]
log = logging.getLogger(__name__)


def handler(job_name: str) -> Callable[[Handler], Handler]:
    def register(function: Handler) -> Handler:
        if job_name in HANDLERS and HANDLERS[job_name] is not function:
            raise ValueError(f"a handler for job {job_name!r} is already registered")
        HANDLERS[job_name] = function
        return function

    return register


def load_handler_modules(modules: list[str]) -> None:
    """Import modules whose `@handler` decorators register more handlers."""
    for module in modules:
        importlib.import_module(module)


@handler("noop")
def noop(run: ClaimedRun, engine: Engine) -> None:
    """Does nothing: for trying the queue out."""
    log.info("noop run %d (attempt %d)", run.id, run.attempts)
