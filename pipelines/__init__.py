"""rota's Python surface, for code that builds on it: one name per object, the same object
whichever documented path reaches it (`from rota.pipelines import handler` is
`rota.pipelines.queue.handlers.handler`; from a checkout, `from pipelines import handler`
too). Everything else is rota's own and may change between releases (CHANGELOG.md).

There is no `from rota import …`: `rota` is the installed name of this repository, whose
top level the design fixes as folders (pipelines/, resources/, schedules/), so the root a
user imports from is this package."""

if __name__ == "pipelines":  # imported by its checkout name: hand out the installed package's modules
    from rota.resources.checkout_names import answer_to_checkout_names

    answer_to_checkout_names(__name__)
else:
    from rota.pipelines.queue.claims import ClaimedRun
    from rota.pipelines.queue.enqueue import AlreadyQueued, Enqueued, enqueue_scheduled
    from rota.pipelines.queue.handlers import handler
    from rota.pipelines.queue.jobs import register_job
    from rota.pipelines.queue.producing import Produced, produce, produce_many
    from rota.resources.database.engine import make_engine

    __all__ = ["AlreadyQueued", "ClaimedRun", "Enqueued", "Produced", "enqueue_scheduled", "handler", "make_engine",
               "produce", "produce_many", "register_job"]
