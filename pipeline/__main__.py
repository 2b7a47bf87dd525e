"""``python -m pipeline JOB ...``: the same as ``kcoord pipeline JOB ...``."""

import sys

from pipeline.cli import main

sys.exit(main())
