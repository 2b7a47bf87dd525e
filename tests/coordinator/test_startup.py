"""The server's start-up skips kafka-python's and aiokafka's client imports (coordinator.startup), and
code that wants those clients still gets them. Run in fresh interpreters: this test process has long
imported both packages whole."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLIENT_MODULES = ("kafka.admin", "kafka.consumer", "kafka.producer", "aiokafka.client", "aiokafka.consumer",
                  "aiokafka.producer")
# Also left until needed: importlib.metadata (crc32c's __init__), kafka-python's batch reader and codecs
# (compressed batches, the cleaner's rebuilds), and its message classes (protocol.records builds those of
# our record schemas when a group metadata record is first read or written)
UNNEEDED_AT_START = (*CLIENT_MODULES, "importlib.metadata", "kafka.record", "kafka.codec", "kafka.protocol.api_data")


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_server_path_imports_no_client() -> None:
    loaded = run(
        "import sys\n"
        "import coordinator.cli, coordinator.server, coordinator.exporter, coordinator.gateway.relay\n"
        "from coordinator.apis import load_all\n"
        "assert len(load_all()) > 10\n"
        "from storage.batch import decode_batch\n"
        "from storage.batchwriter import build_batch\n"
        "batch = build_batch(0, [(b'k', b'v')], 1)\n"
        "assert [r.key for r in decode_batch(batch).records] == [b'k']\n"
        f"print(sorted(m for m in {UNNEEDED_AT_START!r} if m in sys.modules))\n")
    assert loaded.strip() == "[]"


def test_the_collector_is_paused_only_while_the_cli_imports() -> None:
    """``coordinator.startup`` pauses cyclic collection; the CLI's imports end the pause, with what
    they made frozen, so no later collection scans it (and no process is left without a collector)."""
    out = run(
        "import gc\n"
        "assert gc.isenabled()\n"
        "import coordinator.startup\n"
        "assert not gc.isenabled()\n"
        "import coordinator.cli\n"
        "print(gc.isenabled(), gc.get_freeze_count() > 10000)\n")
    assert out.strip() == "True True"


def test_the_clients_and_package_attributes_are_still_there_when_asked_for() -> None:
    out = run(
        "import coordinator.cli\n"
        "import kafka, aiokafka\n"
        "from kafka import KafkaAdminClient, KafkaConsumer\n"
        "from aiokafka import AIOKafkaConsumer\n"
        "assert kafka.__version__ and aiokafka.__version__\n"
        "assert KafkaConsumer.__module__.startswith('kafka.consumer')\n"
        "assert kafka.protocol.api_data is not None  # submodules imported before the init ran\n"
        "try:\n"
        "    kafka.no_such_name\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n")
    assert out.strip() == "module 'kafka' has no attribute 'no_such_name'"


def test_threads_asking_at_once_all_wait_for_the_one_init() -> None:
    out = run(
        "import coordinator.startup, importlib, threading\n"
        "errors = []\n"
        "def ask(package, name):\n"
        "    try:\n"
        "        getattr(importlib.import_module(package), name)\n"
        "    except BaseException as exc:\n"
        "        errors.append(repr(exc))\n"
        "threads = [threading.Thread(target=ask, args=asked) for asked in\n"
        "           [('kafka', 'KafkaConsumer'), ('aiokafka', 'AIOKafkaProducer'), ('kafka', '__version__')] * 4]\n"
        "for t in threads: t.start()\n"
        "for t in threads: t.join()\n"
        "print(errors)\n")
    assert out.strip() == "[]"


def test_an_init_that_raises_leaves_the_package_to_be_imported_afresh(tmp_path: Path) -> None:
    """As a failed import does: the package leaves ``sys.modules``, and the next import runs it again."""
    package = tmp_path / "brokenpkg"
    package.mkdir()
    (package / "__init__.py").write_text("import sys\nsys.stdout.write('init ran\\n')\nraise RuntimeError('boom')\n")
    (package / "part.py").write_text("VALUE = 1\n")
    out = run(
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from coordinator.startup import defer_package_inits\n"
        "assert defer_package_inits(('brokenpkg',)) == ['brokenpkg']\n"
        "import brokenpkg.part\n"
        "assert brokenpkg.part.VALUE == 1  # a submodule needs no init\n"
        "for _ in range(2):\n"
        "    try:\n"
        "        import brokenpkg\n"
        "        brokenpkg.missing\n"
        "    except RuntimeError as exc:\n"
        "        print(exc, 'brokenpkg' in sys.modules)\n")
    assert out.splitlines() == ["init ran", "boom False", "init ran", "boom False"]


def test_client_submodules_imported_first_still_import() -> None:
    """They load before their package's ``__init__`` here; what they take from the package (a
    submodule, ``__version__``) is served without it."""
    out = run(
        "import coordinator.startup, sys\n"
        "import aiokafka.producer, aiokafka.consumer, kafka.admin\n"
        "assert 'aiokafka.client' in sys.modules\n"
        "import aiokafka, kafka\n"
        "assert aiokafka.AIOKafkaProducer is aiokafka.producer.AIOKafkaProducer\n"
        "assert kafka.KafkaAdminClient is kafka.admin.KafkaAdminClient\n"
        "print(aiokafka.__version__)\n")
    assert out.strip() == importlib.metadata.version("aiokafka")
