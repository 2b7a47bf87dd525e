"""The optionally compiled modules (setup.py) are tested both ways: as the install built them and from
their source, interpreted, whatever the install built."""

import importlib.util
import shutil
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest


def interpreted(module: ModuleType) -> ModuleType:
    """``module``'s source beside it, executed as a module of its own (``<package>._<name>_interpreted``)."""
    built = Path(str(module.__file__))
    source = built.with_name(built.name.split(".", 1)[0] + ".py")
    package, _, name = module.__name__.rpartition(".")
    spec = importlib.util.spec_from_file_location(f"{package}._{name}_interpreted", source)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded
    spec.loader.exec_module(loaded)
    assert loaded.__file__ == str(source)
    return loaded


def skip_unless_the_machine_compiles() -> None:
    """The README's install builds the extensions wherever a C compiler and Python's headers exist."""
    from protocol import compiled

    if compiled.pure_python_forced():
        pytest.skip("KCOORD_PURE_PYTHON is set")
    if shutil.which("cc") is None or not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        pytest.skip("no C compiler or Python headers here")


def assert_compiled(installed: ModuleType, pure: ModuleType) -> None:
    """Where the machine can compile, the install built ``installed`` and it is not older than its
    source (a build that silently stopped compiling would otherwise only show up as slowness)."""
    from protocol import compiled

    skip_unless_the_machine_compiles()
    name = installed.__name__.replace(".", "/")
    assert compiled.is_compiled(installed), f"{name} was not compiled: see pip install -v -e ."
    assert not compiled.stale(installed), f"the compiled {name} is older than its source: pip install -e ."
    assert not compiled.is_compiled(pure)


def build(param: str, installed: ModuleType, pure: ModuleType) -> ModuleType:
    """A both-builds fixture's module: ``pure`` for "interpreted", else ``installed`` if it is compiled."""
    from protocol import compiled

    if param == "interpreted":
        return pure
    if not compiled.is_compiled(installed):
        pytest.skip(f"this install has no compiled {installed.__name__} (no C compiler, or KCOORD_PURE_PYTHON)")
    return installed

