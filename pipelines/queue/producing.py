"""Sources' runs, identified by (source, source_ref): inserted, or a still-queued run's
payload refreshed; a run that is running or finished is never touched."""

from dataclasses import dataclass

from sqlalchemy import ARRAY, BigInteger, Connection, Engine, Text, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from rota.pipelines.queue.jobs import check_payload, check_text
from rota.pipelines.queue.transaction import transaction
from rota.resources.database.schema import MAX_REF_LENGTH
from rota.resources.database.queries import queries

QUERIES = queries("rota.pipelines.queue")


_PRODUCE_MANY = text(QUERIES["produce_many"]).bindparams(
    bindparam("refs", type_=ARRAY(Text)),
    bindparam("job_ids", type_=ARRAY(BigInteger)),
    bindparam("payloads", type_=ARRAY(JSONB)),
)

_JOB_IDS = text(QUERIES["job_ids"]).bindparams(
    bindparam("names", type_=ARRAY(Text))
)


@dataclass(frozen=True)
class Produced:
    """What producing did to each ref: created, refreshed (payload replaced while still
    queued) or unchanged (same payload, or the run is running or finished)."""

    outcomes: dict[str, str]

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)


def produce_many(conn: Connection | Engine, source: str, items: list[tuple[str, str, dict]]) -> Produced:
    """Produce runs from one source: items are (source_ref, job_name, payload). Upserts on
    `job_queue_source_identity`; a run that is running or finished is never modified; an
    identical second produce writes nothing at all."""
    if not source:
        raise ValueError("a source needs a name")
    check_text(source, "source", f"source {source[:80]!r}", max_length=200)
    latest = {ref: (job_name, payload) for ref, job_name, payload in items}
    for ref, (_, payload) in latest.items():
        row = f"source {source!r} ref {ref[:80]!r}"
        check_text(ref, "source_ref", row, max_length=MAX_REF_LENGTH)
        check_payload(payload, row)
    with transaction(conn) as c:
        names = sorted({job_name for job_name, _ in latest.values()})
        job_ids = dict(c.execute(_JOB_IDS, {"names": names}).all())
        unknown = [n for n in names if n not in job_ids]
        if unknown:
            raise LookupError(f"source {source!r}: no job named {', '.join(map(repr, unknown))}")
        refs = sorted(latest)
        returned = dict(c.execute(_PRODUCE_MANY, {
            "source": source,
            "refs": refs,
            "job_ids": [job_ids[latest[ref][0]] for ref in refs],
            "payloads": [latest[ref][1] for ref in refs],
        }).all())
    return Produced({ref: ("created" if returned[ref] else "refreshed") if ref in returned else "unchanged"
                     for ref in refs})


def produce(conn: Connection | Engine, source: str, source_ref: str, job_name: str, payload: dict) -> str:
    """Produce one run: returns "created", "refreshed" or "unchanged"."""
    return produce_many(conn, source, [(source_ref, job_name, payload)]).outcomes[source_ref]
