"""bench.client's CPU accounting: a server's helper processes count as the server's CPU."""

import subprocess
import sys
import time

from bench.client import cpu_seconds, process_tree_cpu

# A parent that starts a child spinning for ``BURN_S`` of CPU, prints the child's pid, waits for it
# and then idles until stdin closes: the child's time reaches the parent's figures only as reaped.
PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import sys,time\\nt=time.process_time()\\nprint(flush=True)\\n"
                          "sys.stdin.readline()\\nwhile time.process_time()-t<%(burn)s: pass"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
sys.stdin.readline()
child.stdin.close()
child.wait()
print("reaped", flush=True)
sys.stdin.readline()
"""
BURN_S = 0.4


def test_a_live_child_and_then_a_reaped_child_count_as_the_parents_cpu() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT % {"burn": BURN_S}], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert parent.stdin is not None and parent.stdout is not None
    try:
        child_pid = int(parent.stdout.readline())
        before_own, before_tree = cpu_seconds(f"/proc/{parent.pid}/stat"), process_tree_cpu(parent.pid)
        parent.stdin.write("go\n")
        parent.stdin.flush()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the child spins; seen through the parent while alive
            spent = process_tree_cpu(parent.pid) - before_tree
            if spent >= BURN_S / 2:
                break
            time.sleep(0.02)
        assert process_tree_cpu(parent.pid) - before_tree >= BURN_S / 2
        assert cpu_seconds(f"/proc/{parent.pid}/stat") - before_own < BURN_S / 4  # not the parent's own
        assert parent.stdout.readline().strip() == "reaped"
        after = process_tree_cpu(parent.pid) - before_tree  # now through cutime/cstime
        assert after >= BURN_S * 0.9
        assert cpu_seconds(f"/proc/{parent.pid}/stat", reaped=True) - before_own >= BURN_S * 0.9
        assert not _alive(child_pid)
    finally:
        parent.stdin.close()
        parent.wait(30)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
