"""bench.client's CPU accounting: a server's helper processes count as the server's CPU."""

import subprocess
import sys

from bench.client import _children, children_by_parent, cpu_seconds, process_tree_cpu, stat_fields

# A parent whose child spins for ``burn`` seconds of CPU and then waits, alive, until told to end;
# the parent then reaps it and idles. The child's time reaches the parent's own figures only once
# reaped (cutime/cstime).
CHILD = ("import sys, time\nprint(flush=True)\nsys.stdin.readline()\nt = time.process_time()\n"
         "while time.process_time() - t < %(burn)s: pass\nprint(flush=True)\nsys.stdin.readline()\n")
PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", %(child)r], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
for line in sys.stdin:  # "burn": the child spins; "end": it ends and is reaped
    if line.strip() == "burn":
        child.stdin.write(b"go\\n"); child.stdin.flush()
        child.stdout.readline()
        print("burnt", flush=True)
    else:
        child.stdin.close()
        child.wait()
        print("reaped", flush=True)
"""
BURN_S = 0.4


def test_a_live_child_and_then_a_reaped_child_count_as_the_parents_cpu() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT % {"child": CHILD % {"burn": BURN_S}}],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert parent.stdin is not None and parent.stdout is not None
    try:
        child_pid = int(parent.stdout.readline())
        own0, tree0 = cpu_seconds(f"/proc/{parent.pid}/stat", reaped=True), process_tree_cpu(parent.pid)
        parent.stdin.write("burn\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "burnt"
        assert _alive(child_pid)  # spun, and still running: only the walk over live children sees it
        assert _children(parent.pid) == children_by_parent(parent.pid) == [child_pid]  # either way of finding it
        live = process_tree_cpu(parent.pid) - tree0
        assert BURN_S * 0.9 <= live <= BURN_S * 1.5, live  # counted once
        assert cpu_seconds(f"/proc/{parent.pid}/stat", reaped=True) - own0 < BURN_S / 4
        parent.stdin.write("end\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "reaped"
        assert not _alive(child_pid)
        reaped = process_tree_cpu(parent.pid) - tree0  # now through the parent's cutime/cstime
        assert BURN_S * 0.9 <= reaped <= BURN_S * 1.5, reaped
        assert cpu_seconds(f"/proc/{parent.pid}/stat", reaped=True) - own0 >= BURN_S * 0.9
    finally:
        parent.stdin.close()
        parent.wait(30)


def _alive(pid: int) -> bool:
    try:
        return stat_fields(f"/proc/{pid}/stat")[0] != "Z"
    except FileNotFoundError:
        return False
