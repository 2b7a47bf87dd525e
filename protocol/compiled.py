"""Which of kcoord's optionally compiled modules (setup.py) run compiled, and whether a compiled one is
stale: an editable install whose sources were edited or checked out after ``pip install -e .``. Python
imports the compiled module before the source beside it, so a stale one would run old code. Compiled
code also has the layouts of what it imports built in (a NamedTuple's fields are read by position), so
the kcoord modules it imports directly count as its sources too."""

import functools
import hashlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

SLACK_S = 2.0  # file systems with coarse timestamps
SOURCES_MANIFEST = "kcoord_compiled.sources.json"  # setup.py's: each source's SHA-256 when it was built
PACKAGES = ("coordinator", "protocol", "storage")
# What setup.py compiles (its COMPILED, as module names; a test keeps the two lists equal).
MODULES = ("storage.batch", "storage.loadcodec", "coordinator.loader", "coordinator.state",
           "storage.batchwriter", "protocol.framing", "protocol.header", "protocol.registry", "coordinator.server",
           "coordinator.connection", "coordinator.request", "coordinator.runtime", "coordinator.shard",
           "coordinator.shardlifecycle", "coordinator.shardstate", "coordinator.pending", "coordinator.flusher",
           "coordinator.metrics", "coordinator.timers", "protocol.hotcodec", "protocol.commit",
           "protocol.offsetfetch", "coordinator.offsets", "coordinator.apis.k08_offset_commit",
           "coordinator.apis.k09_offset_fetch")


def pure_python_forced() -> bool:
    """``KCOORD_PURE_PYTHON=1``: at install time nothing is compiled; at run time every kcoord module
    is imported from its source even where the install compiled it (``prefer_source``)."""
    return os.environ.get("KCOORD_PURE_PYTHON", "") not in ("", "0")


class _SourceFirst:
    """A meta path finder that finds a kcoord module's ``.py`` before the compiled module beside it (the
    default finders try extension modules first). Packages are left to the default finders."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if path is None or name.split(".", 1)[0] not in PACKAGES:
            return None
        leaf = name.rpartition(".")[2]
        for entry in path:
            source = Path(entry, f"{leaf}.py")
            if source.is_file():
                return importlib.util.spec_from_file_location(name, source)
        return None


def prefer_source() -> None:
    """Called by each kcoord package's ``__init__`` before any of its modules is imported: with
    ``KCOORD_PURE_PYTHON`` set, a compiled install runs from its sources (the tests run the server's
    path that way too; an operator can rule the compiled build out with it)."""
    if pure_python_forced() and not any(isinstance(finder, _SourceFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())


def is_compiled(module: ModuleType) -> bool:
    """Whether ``module`` was imported from a C extension rather than from its source."""
    return not str(module.__file__).endswith(".py")


# ``from a.b import c, d`` (names possibly in parentheses over several lines) and ``import a.b, c``,
# at any indentation. Read with a pattern rather than parsed: parsing the sources of six compiled
# modules cost ~30 ms of every start. A line in a docstring that looks like an import only adds a file
# to check.
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)|import[ \t]+([^\n]*))", re.M)


def _imported(text: str) -> list[str]:
    names: list[str] = []
    for module, imported, plain in _IMPORT.findall(text):
        if module:
            # ``from package import module`` imports a module too
            names += [module, *(f"{module}.{alias}" for alias in _aliases(imported.strip("()")))]
        else:
            names += _aliases(plain)
    return names


def _aliases(listed: str) -> list[str]:
    """The imported names of ``a as b, c`` (a comment after them dropped)."""
    return [part.split()[0] for part in re.sub(r"#[^\n]*", "", listed).split(",") if part.strip()]


@functools.cache
def sources(module: ModuleType) -> list[Path]:
    """The source beside ``module`` and those of the kcoord modules it imports directly (read once:
    the loader and ``kcoord serve`` both ask at start-up)."""
    source = _own_source(module)
    root = _root(module)
    found = [source]
    for name in _imported(source.read_text(encoding="utf-8")):
        if name.split(".")[0] in PACKAGES:
            path = root.joinpath(*name.split("."))
            path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
            if path.is_file() and path not in found:
                found.append(path)
    return found


def stale(module: ModuleType) -> bool:
    """True when ``module`` runs compiled and one of its ``sources`` changed since the build. Where the
    build recorded what it read (setup.py's manifest) the content decides, whatever the file's time: a
    checkout or a copy put back is not stale, and an edit saved while the build ran, or a copy that
    kept older times, is; so is the module's own source gone since. A source the build did not record
    (an older build, a module added since) is stale when it is newer than the build."""
    if not is_compiled(module):
        return False
    root = _root(module)
    recorded = _manifest(root)
    try:
        built = Path(str(module.__file__)).stat().st_mtime
        found = sources(module)
    except OSError:  # its own source is gone: stale if the build had one, else a build shipped without sources
        return _relative(root, _own_source(module)) in recorded
    for path in found:
        known = recorded.get(_relative(root, path))
        try:
            if (_digest(path) != known) if known is not None else path.stat().st_mtime > built + SLACK_S:
                return True
        except OSError:  # removed or unreadable since ``sources`` found it: not what was built
            return True
    return False


def _own_source(module: ModuleType) -> Path:
    built = Path(str(module.__file__))
    return built.with_name(built.name.split(".", 1)[0] + ".py")


def _relative(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def _digest(path: Path) -> str:
    """A source's SHA-256, read once per version of the file (the compiled modules share many sources)."""
    stat = path.stat()
    return _hashed(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _hashed(path: Path, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _root(module: ModuleType) -> Path:
    """The directory the module's top-level package is in."""
    return Path(str(module.__file__)).parents[module.__name__.count(".")]


@functools.cache
def _manifest(root: Path) -> dict[str, str]:
    """The build's record of its sources (an empty one when it has none: an older build, or a broken file)."""
    try:
        found = json.loads((root / SOURCES_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}
