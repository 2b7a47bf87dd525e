"""The pure-Python build of the request path passes the server's tests too: where the install compiled
kcoord (setup.py), the rest of the suite runs the compiled modules, so these tests run again with
``KCOORD_PURE_PYTHON=1``, which imports every kcoord module from its source (protocol/compiled.py), in
this process and in every kcoord they start. A machine without a C compiler runs that build anyway."""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The server's own tests: requests of every API over real sockets and clients, bad input, flow control,
# stalls, shutdown, full disks, shards and group membership.
SUBSET = ["tests/integration/test_apis.py", "tests/integration/test_bad_input.py",
          "tests/integration/test_clients.py", "tests/integration/test_flow_control.py",
          "tests/integration/test_lifecycle.py", "tests/integration/test_stalls.py",
          "tests/integration/test_disk_full.py", "tests/coordinator/test_shard.py",
          "tests/coordinator/groups", "tests/protocol/test_registry.py"]


def test_every_kcoord_module_is_imported_from_its_source() -> None:
    code = ("import sys, coordinator.cli, coordinator.server, coordinator.apis.k08_offset_commit, "
            "coordinator.apis.k09_offset_fetch, protocol.hotcodec, storage.loadcodec\n"
            "print('\\n'.join(m.__file__ for n, m in sys.modules.items() "
            "if n.split('.')[0] in ('coordinator', 'protocol', 'storage') or 'mypyc' in n))")
    env = {**os.environ, "KCOORD_PURE_PYTHON": "1"}
    files = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    assert len(files) > 30
    assert all(f.endswith(".py") for f in files), [f for f in files if not f.endswith(".py")]


def test_the_servers_tests_pass_interpreted() -> None:
    env = {**os.environ, "KCOORD_PURE_PYTHON": "1"}
    # A session of its own: if it hangs, the kcoord processes its tests started go with it.
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUBSET], env=env,
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        out, err = run.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        out, err = run.communicate()
    assert run.returncode == 0, out[-6000:] + err[-2000:]
    assert " passed" in out.splitlines()[-1]
