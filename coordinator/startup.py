"""What a starting server need not import: the client halves of kafka-python and aiokafka.

kcoord uses their protocol schemas and record-batch classes only, but importing any submodule of a
package runs the package's ``__init__``, and theirs import the whole client (admin, consumer,
producer, networking): ``python -X importtime`` put kafka's at ~90 ms and aiokafka's at ~37 ms, ~100
ms more than kcoord's own imports of them, out of a restart target of 1 s counted from the process
start. The CLI therefore imports this module before anything else of kcoord's, and it registers each
package without running its ``__init__``. The first attribute asked of such a package that it does not
have yet (``from kafka import KafkaAdminClient``, ``kafka.__version__``) runs the ``__init__`` then, so
code that wants the client gets it unchanged; submodule imports never need it.
"""

import importlib.util
import sys
import threading
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

DEFERRED = ("kafka", "aiokafka")


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
        module.__getattr__ = _init_on_miss(module, spec)  # type: ignore[method-assign]
        sys.modules[name] = module
        done.append(name)
    return done


def _init_on_miss(module: ModuleType, spec: ModuleSpec) -> Any:
    lock = threading.Lock()

    def __getattr__(attr: str) -> Any:
        """PEP 562: called only for a name the module lacks. Runs the package's ``__init__`` once (its
        own lookups then fail normally: this hook is gone), then answers from what it defined."""
        with lock:
            if module.__dict__.get("__getattr__") is __getattr__:
                del module.__dict__["__getattr__"]
                assert spec.loader is not None
                spec.loader.exec_module(module)
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}") from None

    return __getattr__


defer_package_inits()
