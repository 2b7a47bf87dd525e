"""The optional compile step: the modules in COMPILED (the loader: batches decoded and replayed, no
generators; the flush's batch builder, and every request's way from its frame to its reply, with OffsetCommit's and
OffsetFetch's codecs and handlers) are built with mypyc when mypy and a working C compiler are
present, and shipped as plain source otherwise (one line on stderr says which).
``KCOORD_PURE_PYTHON=1`` forces pure Python (and, at run time, imports every module from its source:
protocol/compiled.py). Everything else is in pyproject.toml.

The .py file is always installed too: without the extension, Python simply imports the source.
"""

import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

# Built together into one shared library (GROUP, a top-level module) so calls between them are C calls;
# each also gets a small shim module of its own name.
COMPILED = [
    # the loader (batches decoded and replayed; storage/segments.py's generator is not: test_compiled.py), and
    # the flush's batch builder
    "storage/batch.py", "storage/loadcodec.py", "coordinator/loader.py", "coordinator/state.py",
    "storage/batchwriter.py",
    # every request's way: framing, header, registry, server, connection, request, runtime, shard (and its
    # lifecycle, its base class), flusher, metrics
    "protocol/framing.py", "protocol/header.py", "protocol/registry.py", "coordinator/server.py",
    "coordinator/connection.py", "coordinator/request.py", "coordinator/runtime.py", "coordinator/shard.py",
    "coordinator/shardlifecycle.py", "coordinator/shardstate.py", "coordinator/pending.py",
    "coordinator/flusher.py",
    "coordinator/metrics.py", "coordinator/timers.py",
    # OffsetCommit and OffsetFetch
    "protocol/hotcodec.py", "protocol/commit.py", "protocol/offsetfetch.py", "coordinator/offsets.py",
    "coordinator/apis/k08_offset_commit.py",
    "coordinator/apis/k09_offset_fetch.py",
]
GROUP = "kcoord_compiled"
SOURCES_MANIFEST = f"{GROUP}.sources.json"  # beside the group's library; read by protocol/compiled.py
PACKAGES = ("coordinator", "protocol", "storage")  # protocol/compiled.py's PACKAGES (a test keeps them equal)
_built_from: dict[str, str] = {}  # each package source's SHA-256 as mypyc read it


def _say(message: str) -> None:
    print(f"kcoord build: {message}", file=sys.stderr, flush=True)


def _remove_compiled() -> None:
    """Drops compiled modules an earlier build left beside the sources (an editable install would still
    import them) and in ``build/`` (a wheel would ship them): a pure build must really be pure."""
    Path(SOURCES_MANIFEST).unlink(missing_ok=True)
    for stem in [*(Path(source).with_suffix("") for source in COMPILED), Path(GROUP)]:
        for old in [*Path().glob(f"{stem}*.so"), *Path().glob(f"{stem}*.pyd"), *Path("build").glob(f"lib*/{stem}*")]:
            old.unlink()


class _OptionalBuildExt(build_ext):
    """A compile that fails (no compiler, no Python headers) leaves the pure-Python module in place: mypyc
    makes two extensions per module (its code and a shim importing it), so one failing drops both."""

    failed = False

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            _say(f"mypyc extension not built ({exc}); using pure Python")
            self.failed = True
        if self.failed:
            for ext in self.extensions:
                Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            _remove_compiled()
            return
        # A shim whose C source did not change is not rebuilt and keeps its old time: stamp every output
        # now, so a source newer than the build (protocol/compiled.py) was really written after it.
        for ext in self.extensions:
            out = Path(self.get_ext_fullpath(ext.name))
            if out.exists():
                out.touch()
        # What the build was made from, so a source whose time is newer but whose content is the same (a
        # checkout, a copy restored) is not called stale: a stale module turns the fast paths off.
        if self.extensions and _built_from:
            manifest = Path(self.get_ext_fullpath(GROUP)).with_name(SOURCES_MANIFEST)
            manifest.write_text(json.dumps(_built_from, indent=0, sort_keys=True) + "\n", encoding="utf-8")

    def build_extension(self, ext: Any) -> None:
        if self.failed:
            return
        try:
            super().build_extension(ext)
        except Exception as exc:
            _say(f"mypyc extension {ext.name} not built ({exc}); using pure Python")
            self.failed = True


def _ext_modules() -> list[Any]:
    if sys.argv[1:2] in (["egg_info"], ["dist_info"], ["sdist"]):
        return []  # metadata only (pip asks for it before building): no need to run mypy for it
    if os.environ.get("KCOORD_PURE_PYTHON", "") not in ("", "0"):
        _say("KCOORD_PURE_PYTHON is set: pure Python")
        _remove_compiled()
        return []
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        _say("no Python headers (Python.h): pure Python")
        _remove_compiled()
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypy/mypyc not available: pure Python")
        _remove_compiled()
        return []
    _built_from.update({path.as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
                        for package in PACKAGES for path in sorted(Path(package).rglob("*.py"))})
    try:
        # Only the named modules are compiled; the ones they import are type-checked, not built. Options are
        # given here so the build does not depend on the installed versions of our dependencies' stubs.
        modules: list[Any] = mypycify(["--ignore-missing-imports", "--no-warn-unused-ignores", *COMPILED],
                                      opt_level="3", group_name=GROUP)
    except BaseException as exc:  # mypy reports type errors with SystemExit
        _say(f"mypyc failed ({exc!r}): pure Python")
        _remove_compiled()
        return []
    _say(f"compiling {', '.join(COMPILED)} with mypyc")
    return modules


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": _OptionalBuildExt})
