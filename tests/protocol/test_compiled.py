"""Stale compiled modules are noticed: their own source or a kcoord module they import edited after the
build (compiled code reads an imported NamedTuple's fields by position)."""

import ast
import enum
import hashlib
import importlib
import json
import os
import re
from pathlib import Path
from types import ModuleType

import pytest

from coordinator.cli import warn_stale_builds
from protocol import compiled
from tests.interpreted import skip_unless_the_machine_compiles

ROOT = Path(__file__).resolve().parents[2]

BUILT = 1_000_000.0


def fake_build(root: Path) -> ModuleType:
    """``storage/codec`` as a built extension beside its source, importing one kcoord module, one
    package and one outside module."""
    (root / "storage").mkdir()
    (root / "protocol" / "sub").mkdir(parents=True)
    (root / "storage" / "codec.py").write_text(
        "import os\nfrom protocol.records import Key\nfrom protocol import sub\nfrom . import sibling\n")
    (root / "protocol" / "records.py").write_text("Key = tuple\n")
    (root / "protocol" / "__init__.py").write_text("")
    (root / "protocol" / "sub" / "__init__.py").write_text("")
    so = root / "storage" / "codec.cpython-311-x86_64-linux-gnu.so"
    so.write_bytes(b"")
    for path in [*root.rglob("*.py"), so]:
        os.utime(path, (BUILT, BUILT))
    module = ModuleType("storage.codec")
    module.__file__ = str(so)
    return module


def test_sources_are_the_module_and_the_kcoord_modules_it_imports(tmp_path: Path) -> None:
    module = fake_build(tmp_path)
    assert compiled.sources(module) == [tmp_path / "storage" / "codec.py", tmp_path / "protocol" / "records.py",
                                        tmp_path / "protocol" / "__init__.py",
                                        tmp_path / "protocol" / "sub" / "__init__.py"]


def test_an_edit_to_the_source_or_an_imported_module_makes_it_stale(tmp_path: Path) -> None:
    module = fake_build(tmp_path)
    assert compiled.is_compiled(module) and not compiled.stale(module)
    for edited in ("storage/codec.py", "protocol/records.py", "protocol/sub/__init__.py"):
        os.utime(tmp_path / edited, (BUILT + 60, BUILT + 60))
        assert compiled.stale(module), edited
        os.utime(tmp_path / edited, (BUILT, BUILT))
    assert not compiled.stale(module)


def record_build(root: Path) -> None:
    """The manifest setup.py writes beside the build: every package source's SHA-256 as it was built."""
    recorded = {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
                for path in root.rglob("*.py")}
    (root / compiled.SOURCES_MANIFEST).write_text(json.dumps(recorded))


def test_a_source_put_back_as_it_was_built_is_not_stale(tmp_path: Path) -> None:
    """A checkout or a copy restored gives a source a new time and the same content: the build still
    runs that source, and calling it stale turned the fast paths off (a benchmark run's FAILED)."""
    module = fake_build(tmp_path)
    record_build(tmp_path)
    for touched in ("storage/codec.py", "protocol/records.py"):
        os.utime(tmp_path / touched, (BUILT + 60, BUILT + 60))
    assert not compiled.stale(module)
    (tmp_path / "protocol" / "records.py").write_text("Key = list\n")
    os.utime(tmp_path / "protocol" / "records.py", (BUILT + 60, BUILT + 60))
    assert compiled.stale(module)


def test_a_recorded_source_with_other_content_is_stale_whatever_its_time(tmp_path: Path) -> None:
    """An edit saved while the build ran (setup.py then stamps the build later than it) or a copy that kept
    its older times (cp -p, rsync -a, tar): not what was built, though not newer (a review's find: it
    ran without a warning)."""
    module = fake_build(tmp_path)
    record_build(tmp_path)
    for edited in ("storage/codec.py", "protocol/records.py"):
        before = (tmp_path / edited).read_bytes()
        (tmp_path / edited).write_bytes(before + b"X_EDIT = 1\n")
        os.utime(tmp_path / edited, (BUILT - 100, BUILT - 100))
        assert compiled.stale(module), edited
        (tmp_path / edited).write_bytes(before)
        os.utime(tmp_path / edited, (BUILT - 100, BUILT - 100))
        assert not compiled.stale(module), edited


def test_a_module_whose_source_is_gone_is_stale_when_the_build_had_it(tmp_path: Path) -> None:
    """Its compiled code runs with nothing beside it to say what it should be (a review's find: judged
    fresh). A build that recorded no sources (an older one, or shipped without them) is left alone."""
    module = fake_build(tmp_path)
    (tmp_path / "storage" / "codec.py").rename(tmp_path / "codec.py.moved")
    assert not compiled.stale(module)
    (tmp_path / "codec.py.moved").rename(tmp_path / "storage" / "codec.py")
    record_build(tmp_path)
    compiled._manifest.cache_clear()  # read once per process, as a server reads it
    (tmp_path / "storage" / "codec.py").rename(tmp_path / "codec.py.moved")
    assert compiled.stale(module)


def test_a_source_the_build_did_not_record_is_judged_by_its_time(tmp_path: Path) -> None:
    module = fake_build(tmp_path)
    record_build(tmp_path)
    (tmp_path / "protocol" / "late.py").write_text("")
    with (tmp_path / "storage" / "codec.py").open("a") as f:
        f.write("from protocol import late\n")
    recorded = json.loads((tmp_path / compiled.SOURCES_MANIFEST).read_text())
    recorded["storage/codec.py"] = hashlib.sha256((tmp_path / "storage" / "codec.py").read_bytes()).hexdigest()
    (tmp_path / compiled.SOURCES_MANIFEST).write_text(json.dumps(recorded))
    for path in ("storage/codec.py", "protocol/late.py"):
        os.utime(tmp_path / path, (BUILT, BUILT))
    assert not compiled.stale(module)
    os.utime(tmp_path / "protocol" / "late.py", (BUILT + 60, BUILT + 60))
    assert compiled.stale(module)


@pytest.mark.parametrize("manifest", ["not json", "[1, 2]"])
def test_an_unreadable_manifest_leaves_the_times_to_judge(tmp_path: Path, manifest: str) -> None:
    module = fake_build(tmp_path)
    (tmp_path / compiled.SOURCES_MANIFEST).write_text(manifest)
    os.utime(tmp_path / "protocol" / "records.py", (BUILT + 60, BUILT + 60))
    assert compiled.stale(module)


def test_a_module_run_from_its_source_is_never_stale(tmp_path: Path) -> None:
    module = fake_build(tmp_path)
    module.__file__ = str(tmp_path / "storage" / "codec.py")
    os.utime(tmp_path / "protocol" / "records.py", (BUILT + 60, BUILT + 60))
    assert not compiled.is_compiled(module) and not compiled.stale(module)


def test_every_form_of_import_is_found(tmp_path: Path) -> None:
    """Imports are read with a pattern: parenthesized lists over several lines, aliases, comments,
    imports inside functions; relative and outside imports are not kcoord sources."""
    module = fake_build(tmp_path)
    for name in ("a", "b", "c", "d", "e"):
        (tmp_path / "protocol" / f"{name}.py").write_text("")
    (tmp_path / "storage" / "codec.py").write_text(
        "import os, protocol.a as first  # a comment\n"
        "from protocol import (\n    b,  # the b\n    c as sea,\n)\n"
        "from .sibling import x\n"
        "def f() -> None:\n    from protocol.d import thing\n    import protocol.e\n")
    assert compiled.sources(module) == [tmp_path / "storage" / "codec.py", *(
        tmp_path / "protocol" / name for name in ("a.py", "__init__.py", "b.py", "c.py", "d.py", "e.py"))]



def test_the_module_list_is_what_setup_compiles() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    listed = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "COMPILED" for t in node.targets))
    paths = ast.literal_eval(listed)
    assert tuple(p.removesuffix(".py").replace("/", ".") for p in paths) == compiled.MODULES


@pytest.mark.parametrize("name", compiled.MODULES)
def test_every_listed_module_is_compiled_and_up_to_date(name: str) -> None:
    """Where the machine compiles, a module that silently stopped compiling would only show as slowness."""
    skip_unless_the_machine_compiles()
    module = importlib.import_module(name)
    assert compiled.is_compiled(module), f"{name} was not compiled: see pip install -v -e ."
    assert not compiled.stale(module), f"the compiled {name} is older than its source: pip install -e ."


def test_serve_warns_of_nothing_on_a_fresh_install() -> None:
    skip_unless_the_machine_compiles()
    assert warn_stale_builds() == []


def test_the_build_records_what_it_was_built_from() -> None:
    """setup.py writes the manifest stale() reads, under the same name, with every compiled module's source."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    named = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "SOURCES_MANIFEST" for t in node.targets))
    assert isinstance(named, ast.JoinedStr) and ast.unparse(named) == "f'{GROUP}.sources.json'"
    packages = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "PACKAGES" for t in node.targets))
    assert ast.literal_eval(packages) == compiled.PACKAGES  # the sources recorded are those stale() reads
    assert compiled.SOURCES_MANIFEST == "kcoord_compiled.sources.json"
    skip_unless_the_machine_compiles()
    recorded = json.loads((ROOT / compiled.SOURCES_MANIFEST).read_text(encoding="utf-8"))
    assert {f"{name.replace('.', '/')}.py" for name in compiled.MODULES} <= set(recorded)


@pytest.mark.parametrize("name", compiled.MODULES)
def test_a_compiled_function_names_each_handlers_exception_once(name: str) -> None:
    """mypyc gives a local one type, the first it is bound to: a second ``except Other as exc`` in the
    same function then raises TypeError instead of handling ``Other`` (a malformed request closed its
    connection as an internal error that way, tests/integration/test_bad_input.py)."""
    source = ROOT / (name.replace(".", "/") + ".py")
    clashes = []
    for func in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        bound: dict[str, set[str]] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.ExceptHandler) and node.name:
                bound.setdefault(node.name, set()).add(ast.unparse(node.type) if node.type else "BaseException")
        clashes += [f"{func.name} (line {func.lineno}): {var} as {sorted(types)}"
                    for var, types in bound.items() if len(types) > 1]
    assert not clashes, f"{source}: {clashes}"


# Module constants of compiled modules that stay plain names, and why.
NOT_FINAL = {
    "coordinator.metrics.LATENCY_BUCKETS": "a Final tuple of floats: mypyc 2.4 checks it inverted (NameError)",
    "coordinator.runtime.PARTITION_CACHE": "tests/coordinator/test_runtime.py lowers it",
    "coordinator.state.INTERNED_PARTITIONS_MAX": "tests/coordinator/test_state.py lowers it",
    "coordinator.shardlifecycle.PROBE_INTERVAL_S": "tests/coordinator/test_shard.py lowers it",
    "storage.batch.FAST_REPLAY": "tests turn the loader's fast path on and off with it",
}
# Names tests lower with monkeypatch: Final, a literal is inlined and the patch would do nothing.
_PATCHED = {name for path in (ROOT / "tests").rglob("*.py")
            for name in re.findall(r'setattr\([\w.]+, "([A-Z_][A-Z0-9_]+)"', path.read_text(encoding="utf-8"))}
_CONSTANT = re.compile(r"_?[A-Z][A-Z0-9_]+")  # not a one-letter TypeVar


def _constants(source: Path) -> dict[str, bool]:
    """The module's top-level ALL_CAPS names, each with whether it is declared Final."""
    found = {}
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = "Final" in ast.unparse(node.annotation)
        elif isinstance(node, ast.Assign):
            found |= {t.id: False for t in node.targets if isinstance(t, ast.Name)}
    return {name: final for name, final in found.items() if _CONSTANT.fullmatch(name)}


@pytest.mark.parametrize("name", compiled.MODULES)
def test_a_compiled_module_reads_its_constants_natively(name: str) -> None:
    """Compiled code reads a name that is not Final from the module's dictionary at every use: ~150
    instructions, three of them per partition of a commit before the record value's version numbers
    became Final (5% of a 100-partition commit). So the constants a compiled module defines or imports
    from a kcoord module are Final (a literal is then inlined, anything else kept in a C variable)."""
    source = ROOT / (name.replace(".", "/") + ".py")
    patched = [const for const, final in _constants(source).items() if final and const in _PATCHED]
    assert not patched, f"{source}: tests monkeypatch these, which compiled code would not see: {patched}"
    plain = [f"{name}.{const}" for const, final in _constants(source).items() if not final]
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in ("coordinator", "protocol", "storage"):
            origin = ROOT / (node.module.replace(".", "/") + ".py")
            defined = _constants(origin) if origin.exists() else {}
            plain += [f"{node.module}.{alias.name}" for alias in node.names
                      if alias.name in defined and not defined[alias.name]]
    unlisted = [const for const in plain if const not in NOT_FINAL]
    assert not unlisted, f"compiled {name} reads these through a dictionary: make them Final (or list them in " \
                         f"NOT_FINAL): {unlisted}"


@pytest.mark.parametrize("name", compiled.MODULES)
def test_no_compiled_module_defines_a_generator(name: str) -> None:
    """mypyc 2.4's generators crashed the loader: with storage/segments.py compiled, ``read_segment``'s
    generator found the ``with`` block's saved ``__exit__`` NULL when it finished a segment and called it
    (a segmentation fault in about one start in four on a kill -9 campaign's data directory, several
    partitions loading at once). Generators stay interpreted: compiled modules define none."""
    source = ROOT / (name.replace(".", "/") + ".py")
    generators = [node.name for node in ast.walk(ast.parse(source.read_text(encoding="utf-8")))
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and any(isinstance(inner, (ast.Yield, ast.YieldFrom)) for inner in ast.walk(node))]
    assert not generators, f"{source} is compiled and defines generators: {generators}"


@pytest.mark.parametrize("name", compiled.MODULES)
def test_a_compiled_function_reads_enum_members_natively(name: str) -> None:
    """On Python 3.11 every attribute of an Enum class is read through ``EnumType.__getattr__``'s slot
    (600-900 instructions): ``ErrorCode.NONE`` and its kind were ~10% of a 1-partition commit. So
    compiled functions read members from Final module names, which mypyc keeps in C variables."""
    module = importlib.import_module(name)
    source = ROOT / (name.replace(".", "/") + ".py")
    slow = []
    for func in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            slow += [f"{func.name}: {ast.unparse(node)}" for node in ast.walk(func)
                     if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                     and isinstance(getattr(module, node.value.id, None), enum.EnumMeta)]
    assert not slow, f"{source}: {sorted(set(slow))}"
