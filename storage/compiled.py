"""Which of kcoord's optionally compiled modules (setup.py) run compiled, and whether a compiled one is
stale: an editable install whose source was edited or checked out after ``pip install -e .``. Python
imports the compiled module before the source beside it, so a stale one would run old code."""

from pathlib import Path
from types import ModuleType

SLACK_S = 2.0  # file systems with coarse timestamps


def is_compiled(module: ModuleType) -> bool:
    """Whether ``module`` was imported from a C extension rather than from its source."""
    return not str(module.__file__).endswith(".py")


def stale(module: ModuleType) -> bool:
    """True when ``module`` runs compiled and its source beside it is newer than the build."""
    if not is_compiled(module):
        return False
    built = Path(str(module.__file__))
    source = built.with_name(built.name.split(".", 1)[0] + ".py")
    try:
        return source.stat().st_mtime > built.stat().st_mtime + SLACK_S
    except OSError:
        return False
