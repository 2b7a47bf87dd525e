"""What a starting server need not import: the client halves of kafka-python and aiokafka, and the
``importlib.metadata`` that crc32c's ``__init__`` imports only to set its version (~20-35 ms).

kcoord uses their protocol schemas, errors and record-batch modules only, but importing any submodule
of a package runs the package's ``__init__``, and theirs import the whole client (admin, consumer,
producer, networking): ``python -X importtime`` put kafka's at ~90 ms and aiokafka's at ~37 ms, ~100
ms more than kcoord's own imports of them, out of a restart target of 1 s counted from the process
start (storage/batch.py takes crc32c's function from its C module). The CLI therefore imports this
module before anything else of kcoord's, and it registers each package without running its
``__init__``. The first attribute asked of such a package that it does not have yet (``from kafka
import KafkaAdminClient``, ``kafka.__version__``) runs the ``__init__`` then (PEP 562), so code that
wants a client by its package's names gets it unchanged. Other threads asking meanwhile wait for that
run; a run that raises removes the package from ``sys.modules``, as a failed import does, so the next
import starts afresh.

A client *submodule* imported by its own name before the ``__init__`` has run (``import
aiokafka.producer``) loads before that ``__init__``, as it would not normally. What such modules take
from their package is served without it: a submodule (``from kafka import errors``) is imported, and
``__version__`` is read from the installed distribution when first asked (the ``__init__`` sets its
own when it runs; ``importlib.metadata`` is imported only then). A sweep importing each of the 303
submodules of both packages first, in a fresh interpreter, finds every one behaving as without this
module but ``kafka.cluster``: it and ``kafka.net`` import each other, which works only when
``kafka.net`` comes first, as kafka-python's ``__init__`` has it (import ``kafka.net`` or ask the
package first). A finder that ran the ``__init__`` first was tried: the import system calls finders
under its global lock and re-executes a module a finder's side effects loaded, so it deadlocked threads
and loaded modules twice.
"""

import gc
import importlib.util
import logging
import sys
import threading
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

DEFERRED = ("kafka", "aiokafka", "crc32c")


class _Deferred:
    """One package whose ``__init__`` has not run yet: its module's ``__getattr__`` until it has."""

    def __init__(self, name: str, spec: ModuleSpec, module: ModuleType) -> None:
        self.name, self.spec, self.module = name, spec, module
        self._pending = True
        self._lock = threading.RLock()  # reentrant: the __init__'s own lookups come back here

    def __call__(self, attr: str) -> Any:
        if attr == "__version__" and self._pending:
            # what client modules import from their package while its __init__ may be importing them
            version = _distribution_version(self.name)
            if version is not None:
                self.module.__dict__.setdefault("__version__", version)
                return self.module.__dict__["__version__"]
        if self._pending and not attr.startswith("__") and importlib.util.find_spec(f"{self.name}.{attr}"):
            # ``from kafka import errors``: the submodule, as the package would give it (client modules
            # ask for theirs this way while the package's __init__ may be what is importing them)
            return importlib.import_module(f"{self.name}.{attr}")
        with self._lock:
            if self._pending:
                self._pending = False
                try:
                    assert self.spec.loader is not None
                    self.spec.loader.exec_module(self.module)
                except BaseException:
                    if sys.modules.get(self.name) is self.module:
                        del sys.modules[self.name]
                    raise
                finally:
                    self.module.__dict__.pop("__getattr__", None)
        try:
            return self.module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {self.name!r} has no attribute {attr!r}") from None


def _distribution_version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def defer_package_inits(names: tuple[str, ...] = DEFERRED) -> list[str]:
    """Registers each package not imported yet with its ``__init__`` deferred; the names it did."""
    done = []
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__getattr__ = _Deferred(name, spec, module)  # type: ignore[method-assign]
        sys.modules[name] = module
        done.append(name)
    if "kafka" in done:  # what kafka-python's __init__ does first: its loggers stay quiet without a handler
        logging.getLogger("kafka").addHandler(logging.NullHandler())
    return done


_collecting = gc.isenabled()


def imports_done() -> None:
    """Ends the cyclic collector's pause over the start-up imports (``gc.disable()`` below): they make
    ~31,000 long-lived tracked objects (modules, functions, classes), and young collections kept scanning them
    (~40M instructions, ~6% of importing kcoord). What they made is frozen out of its sight instead:
    it lives as long as the process does, after one young collection has freed the cycles they left
    (~570 objects, ~125 kB). The CLI calls this once its own imports are done."""
    gc.collect(0)
    gc.freeze()
    if _collecting:
        gc.enable()


defer_package_inits()
gc.disable()
