"""Sources: producers of work outside rota's own schedules.

A Source names the `job_queue.source` its runs carry, the job (and so the handler) that
executes them, and the convention by which it builds a `source_ref`. The ref is the
run's identity: `produce` upserts on `job_queue_source_identity (source, source_ref)`.
A convention can never change once runs exist: a new convention would not recognise
the old refs and would produce every piece of work again. Each Source's convention is
pinned by a test.

A new Source is a module here, as nightly.py and github.py are, holding its `Source` and
its job's `@handler`, and a producer that registers the job (`register_job`) and queues runs
with `produce_many`: an asset in `SOURCE_ASSETS` (assets.py; the nightly maintenance's) or a
function a sensor in schedules/ calls (the GitHub Source's, in `GITHUB_SENSORS`), which
pipelines/definitions.py loads. Then `sources()` below lists it, so tests/unit/test_sources.py
pins its convention, and `BUILTIN_HANDLER_MODULES` (pipelines/queue/handlers.py) names its
module, so `rota worker` loads its handler."""

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Source:
    name: str
    job_name: str
    ref_convention: str
    ref: Callable[..., str]


def sources() -> dict[str, Source]:
    """Every registered Source by name (imported here: each Source module imports this one)."""
    from rota.pipelines.sources.github import GITHUB
    from rota.pipelines.sources.nightly import NIGHTLY

    return {source.name: source for source in (NIGHTLY, GITHUB)}
