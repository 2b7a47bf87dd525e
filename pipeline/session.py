"""The SparkSession the jobs run in.

Local mode (``local[*]``, the default) keeps everything on loopback: the driver binds 127.0.0.1, the web
UI is off, and the Python workers run this interpreter (``PYSPARK_PYTHON``), so the venv with kcoord
installed is the one that decodes. On a real cluster (``--master spark://...``, ``yarn``, ``k8s://...``)
none of that is forced: the executors need kcoord with the ``pipeline`` extra installed (README).
"""

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOCAL_SHUFFLE_PARTITIONS = 16  # small inputs after the map-side work; AQE coalesces further


def is_local(master: str | None) -> bool:
    return master is not None and master.startswith("local")


def build_session(master: str | None, app_name: str = "kcoord-pipeline", progress: bool | None = None,
                  conf: dict[str, str] | None = None) -> "SparkSession":
    """A session on ``master`` (None: whatever spark-submit was given). ``progress``: Spark's console
    progress bar (default: when stderr is a terminal)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    if is_local(master):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.ui.enabled", "false")
                   .config("spark.sql.shuffle.partitions", str(LOCAL_SHUFFLE_PARTITIONS)))
    show = sys.stderr.isatty() if progress is None else progress
    builder = (builder.config("spark.ui.showConsoleProgress", "true" if show else "false")
               .config("spark.sql.session.timeZone", "UTC"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
