"""The spark-submit entry point: ``spark-submit --master URL pipeline/submit.py JOB ...``.

The master is the one spark-submit was given unless ``--master`` is passed after the job. The executors
need kcoord installed with the pipeline extra (or its packages shipped with ``--py-files``; README)."""

import sys

from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main(default_master=None))
