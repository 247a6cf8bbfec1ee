"""The repository's folders answer to the names SPEC and workspace.yaml use (`pipelines`,
`resources`, `schedules`) with the installed package's own modules (`rota.pipelines`, …).

Without this, a checkout on sys.path loads each file twice, once per name, and every
module-level object exists twice: a handler registered through `pipelines.queue.handlers`
lands in a registry `rota worker` never reads, and `isinstance` fails across the two. A
folder's __init__, imported by its checkout name, calls `answer_to_checkout_names`: from
then on every checkout name is the rota module itself, one module object per file."""

import importlib
import importlib.abc
import importlib.machinery
import sys

CHECKOUT_NAMES = {"pipelines": "rota.pipelines", "resources": "rota.resources", "schedules": "rota.schedules"}


def installed_name(name: str) -> str:
    top, dot, rest = name.partition(".")
    return CHECKOUT_NAMES[top] + dot + rest


class _CheckoutNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a checkout name and hands out the module of its installed name."""

    def __init__(self) -> None:
        self._own_specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in CHECKOUT_NAMES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(installed_name(spec.name))
        self._own_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # The import system set this loader's spec on the module: its own (its files, its
        # resources such as queries.sql) is the one that counts.
        module.__spec__ = self._own_specs.pop(module.__spec__.name)


def answer_to_checkout_names(name: str) -> None:
    """Make `name` (a folder imported by its checkout name, from its __init__) and every
    checkout name after it the installed package's modules."""
    if not any(isinstance(finder, _CheckoutNames) for finder in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutNames())
    sys.modules[name] = importlib.import_module(installed_name(name))
