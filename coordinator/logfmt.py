"""Log output: Kafka-like text lines, or one JSON object per line for log pipelines (``--log-format json``);
and how a failure that persists is logged without flooding the log."""

import datetime
import json
import logging
import time
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...fields, "exception"?}``: time is UTC ISO 8601 with
    milliseconds; fields are the record's ``extra`` values (made strings when JSON cannot hold them)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure_logging(level: str, fmt: str, node: int | None = None) -> None:
    """``node``: a cluster node's id (the nodes of ``--processes`` share one output): each line says which
    (``node-N`` before the logger's name; a ``node`` field in JSON)."""
    handler = logging.StreamHandler()
    text = TEXT_FORMAT if node is None else TEXT_FORMAT.replace(" %(name)s", f" node-{node} %(name)s")
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(text))
    if node is not None and fmt == "json":
        handler.addFilter(_NodeField(node))
    logging.basicConfig(level=level, handlers=[handler], force=True)


class _NodeField(logging.Filter):
    def __init__(self, node: int) -> None:
        super().__init__()
        self.node = node

    def filter(self, record: logging.LogRecord) -> bool:
        record.node = self.node
        return True


class Repeated:
    """Logs a persisting failure once, then at most every ``every_s`` seconds, with the attempt count."""

    def __init__(self, logger: logging.Logger, every_s: float) -> None:
        self._log = logger
        self._every_s = every_s
        self.attempts = 0
        self._last = 0.0

    def report(self, level: int, msg: str, *args: Any) -> None:
        self.attempts += 1
        now = time.monotonic()
        if self.attempts == 1 or now - self._last >= self._every_s:
            self._last = now
            suffix = f" (attempt {self.attempts})" if self.attempts > 1 else ""
            self._log.log(level, msg + suffix, *args)

    def reset(self) -> None:
        self.attempts = 0


def describe_error(exc: BaseException) -> str:
    """An OSError as its message and file name (what an operator acts on), anything else as its repr."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return repr(exc)
