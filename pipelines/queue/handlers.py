"""The handler registry: a job's runs are executed by the handler registered under the
job's name. A handler is a plain callable taking the claimed run and rota's engine."""

import importlib
import logging
import os
import sys
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


class HandlerModuleMissing(ImportError):
    """A module named to register handlers cannot be imported."""


def load_handler_modules(modules: list[str]) -> None:
    """Import modules whose `@handler` decorators register more handlers, finding them from
    the current directory too, as `python -m` would: `rota worker --handlers
    myapp.handlers` is run from the project that holds `myapp/`, by a console script whose
    own directory is the only one Python adds."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name is None or not module.startswith(error.name):
                raise  # the module is there; something it imports is not
            raise HandlerModuleMissing(f"no module {module!r} to load handlers from, from {os.getcwd()} or "
                                       f"PYTHONPATH") from error


@handler("noop")
def noop(run: ClaimedRun, engine: Engine) -> None:
    """Does nothing: for trying the queue out."""
    log.info("noop run %d (attempt %d)", run.id, run.attempts)
