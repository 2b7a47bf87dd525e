"""``kcoord groups``: consumer-group administration over the wire, against any coordinator (kcoord or a
Kafka broker), through kafka-python's admin client.

    kcoord groups [--bootstrap H:P] [--json] list
    kcoord groups describe GROUP          state, protocol, members and their assigned partitions
    kcoord groups offsets GROUP           committed offsets with metadata, log end offsets and lag
    kcoord groups delete GROUP
    kcoord groups reset-offsets GROUP --topic T [--partitions 0,1] [--dry-run]
                  (--to-offset N | --shift-by N | --to-earliest | --to-latest | --to-datetime ISO-8601)
    kcoord groups delete-offsets GROUP --topic T [--partitions 0,1]

Exit codes: 0 done, 1 refused or failed (the reason is printed), 2 bad usage. ``reset-offsets`` is
refused while the group has members, as Kafka's kafka-consumer-groups tool refuses it. Its targets
other than ``--to-offset`` and ``--shift-by`` are looked up in the topic's log with ListOffsets, so
they need the cluster's brokers (kcoord in gateway mode, or a Kafka broker); those two are clamped
to the log's range when the cluster knows the topic, as Kafka's tool clamps them.
"""

import argparse
import datetime
import functools
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from wcwidth import wcswidth

from coordinator.config import bounded_int, reachable_host_port

NEEDS_GROUP = ("describe", "offsets", "delete", "reset-offsets", "delete-offsets")


class GroupsError(Exception):
    """An operation refused or failed; the message says why."""


def _bootstrap(value: str) -> str:
    """``HOST:PORT[,HOST:PORT...]`` checked here, so a typo is a usage error, not the admin client's traceback."""
    try:
        for part in value.split(","):
            reachable_host_port(part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from None
    return value


def _timeout_ms(value: str) -> int:
    try:
        return bounded_int(1)(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_groups_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser("groups", help="list, describe and administer consumer groups")
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", type=_bootstrap,
                        help="a coordinator or broker (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--timeout-ms", type=_timeout_ms, default=30_000,
                        help="how long to wait to reach it, and for each request (default %(default)s)")
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every group with its state and protocol type")
    for name, what in (("describe", "state, protocol, members and their partitions"),
                       ("offsets", "committed offsets with metadata, log end offsets and lag"),
                       ("delete", "delete an empty group")):
        actions.add_parser(name, help=what).add_argument("group")
    reset = actions.add_parser("reset-offsets", help="set committed offsets (the group must have no members)")
    reset.add_argument("group")
    reset.add_argument("--topic", required=True, action=_Once)
    reset.add_argument("--partitions", type=_partitions, action=_Once,
                       help="comma-separated (default: those with an offset)")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-offset", type=_offset, help="this offset")
    target.add_argument("--shift-by", type=_shift, help="the committed offset plus N (N may be negative)")
    target.add_argument("--to-earliest", action="store_true", help="the log's first offset")
    target.add_argument("--to-latest", action="store_true", help="the log's end (past its last record)")
    target.add_argument("--to-datetime", type=_epoch_ms, metavar="ISO-8601",
                        help="the first record at or after this time (UTC unless it gives its zone, e.g. +01:00)")
    reset.add_argument("--dry-run", action="store_true", help="print the new offsets, change nothing")
    delete = actions.add_parser("delete-offsets", help="delete a topic's committed offsets")
    delete.add_argument("group")
    delete.add_argument("--topic", required=True, action=_Once)
    delete.add_argument("--partitions", type=_partitions, action=_Once,
                        help="comma-separated (default: those with an offset)")
    return parser


class _Once(argparse.Action):
    """An option given at most once: argparse keeps only the last of several, so ``--topic a --topic b``
    acted on b alone (an audit's find). One topic per run."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} given twice: one per run")
        setattr(namespace, self.dest, values)


MAX_PARTITION = 2**31 - 1  # partitions are int32 on the wire


def _partitions(value: str) -> list[int]:
    """A non-empty list of partitions, each 0 to 2^31-1: an empty one would read as "not given" (every
    partition with an offset), and one out of range failed only on the wire (an audit's finds)."""
    try:
        partitions = sorted({int(p) for p in value.split(",") if p.strip()})
    except ValueError:
        partitions = []
    if not partitions or not all(0 <= p <= MAX_PARTITION for p in partitions):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a comma-separated list of partitions (integers from 0 to {MAX_PARTITION})")
    return partitions


MAX_OFFSET = 2**63 - 1  # offsets are int64 on the wire


def _offset(value: str) -> int:
    try:
        offset = int(value)
    except ValueError:
        offset = -1
    if not 0 <= offset <= MAX_OFFSET:
        raise argparse.ArgumentTypeError(f"{value!r} is not an offset (an integer from 0 to {MAX_OFFSET})")
    return offset


def _shift(value: str) -> int:
    try:
        shift = int(value)
    except ValueError:
        shift = MAX_OFFSET + 1
    if abs(shift) > MAX_OFFSET:
        raise argparse.ArgumentTypeError(f"{value!r} is not a shift (an integer from -{MAX_OFFSET} to {MAX_OFFSET})")
    return shift


def _epoch_ms(value: str) -> int:
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an ISO-8601 time (e.g. 2026-11-28T10:00:00)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    ms = int(when.timestamp() * 1000)
    if ms < 0:  # ListOffsets takes -1 and -2 for latest and earliest, and no other time before 1970
        raise argparse.ArgumentTypeError(f"{value!r} is before 1970: no record has such a time")
    return ms


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Runs the action; Ctrl-C ends it at once with one line, exit 130. Not by catching
    KeyboardInterrupt: kafka-python's event loop catches what its tasks raise, and a Ctrl-C landing in
    one was swallowed, the command waiting out its timeout (a CI run's find). So the handler exits
    itself: nothing is left to undo (an action's one request was sent or it was not)."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers: the main thread's only
        return _run(args, out)
    previous = signal.signal(signal.SIGINT, functools.partial(_interrupted, args.action))
    try:
        return _run(args, out)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted(action: str, signum: int, frame: Any) -> None:
    sys.stderr.write(f"kcoord groups {action}: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


def _run(args: argparse.Namespace, out: TextIO) -> int:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        # the timeout bounds reaching the coordinator too: kafka-python's bootstrap waits 30 s by default,
        # so an unreachable address took 30 s to report whatever --timeout-ms said
        admin = KafkaAdminClient(bootstrap_servers=args.bootstrap, request_timeout_ms=args.timeout_ms,
                                 bootstrap_timeout_ms=args.timeout_ms, client_id="kcoord-groups")
    except KafkaError as exc:
        print(f"kcoord groups: cannot reach {args.bootstrap}: {exc}", file=sys.stderr)
        return 1
    try:
        result = ACTIONS[args.action](admin, args)
    except GroupsError as exc:
        print(f"kcoord groups {args.action}: {exc}", file=sys.stderr)
        return 1
    except KafkaError as exc:
        print(f"kcoord groups {args.action}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except (ValueError, KeyError, TypeError) as exc:
        # kafka-python can trip over answers it does not expect (a broker's unknown ACL bits, say).
        print(f"kcoord groups {args.action}: the admin client could not use the answer from {args.bootstrap}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        admin.close()
    if args.json:
        json.dump(result.data, out, indent=2, sort_keys=True)
        print(file=out)
    else:
        _table(result.columns, result.rows, out)
    return 0


class Result:
    def __init__(self, data: Any, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.data = data
        self.columns = columns
        self.rows = rows


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    """Columns aligned by how wide each value shows on a terminal, not by its length: a group or topic
    named in CJK characters takes two columns per character, an accent combined with its letter none."""
    cells = [list(columns)] + [["" if v is None else str(v) for v in row] for row in rows]
    shown = [[_shown_width(v) for v in row] for row in cells]
    widths = [max(r[i] for r in shown) for i in range(len(columns))]
    for row, row_shown in zip(cells, shown, strict=True):
        print("  ".join(v + " " * (w - n) for v, n, w in zip(row, row_shown, widths, strict=True)).rstrip(), file=out)


def _shown_width(value: str) -> int:
    """Terminal columns ``value`` takes (wcwidth); its length if it holds a character that has none (a
    control character, printed as it is, as Kafka's tool prints it)."""
    width = wcswidth(value)
    return width if width >= 0 else len(value)


def _describe(admin: Any, group: str) -> dict[str, Any]:
    """The group as DescribeGroups gives it; a group of another protocol type than a consumer's (Kafka
    Connect's) is refused in any state, as Kafka's tool refuses it (describe, reset-offsets)."""
    try:
        described: dict[str, Any] = admin.describe_groups([group])[group]
    except ValueError:
        # kafka-python reads every member's metadata as a consumer subscription, and another protocol's
        # fails with "Buffer underrun" (only a Stable group's answer carries it): the type from ListGroups.
        kinds = {g["group_id"]: g.get("protocol_type") for g in admin.list_groups()}
        _consumer_group(group, kinds.get(group))
        raise
    if described.get("error"):
        raise GroupsError(f"{group}: {described['error']}")
    _consumer_group(group, described.get("protocol_type"))
    return described


def _unknown(described: dict[str, Any]) -> bool:
    """Whether a DescribeGroups answer is for a group the coordinator does not know: Dead, without
    members, is how it describes one."""
    return bool(described.get("group_state") == "Dead" and not described.get("members"))


def _say_if_unknown(action: str, group: str, described: dict[str, Any]) -> None:
    if _unknown(described):
        print(f"kcoord groups {action}: consumer group {group!r} does not exist", file=sys.stderr)


def _consumer_group(group: str, protocol_type: str | None) -> None:
    if protocol_type not in (None, "", "consumer"):
        raise GroupsError(f"{group} is not a consumer group (its protocol type is {protocol_type!r}): only "
                          f"consumer groups are described or reset")


def _list(admin: Any, args: argparse.Namespace) -> Result:
    groups = sorted(admin.list_groups(), key=lambda g: g["group_id"])
    data = [{"group": g["group_id"], "state": g.get("group_state"), "protocol_type": g.get("protocol_type"),
             "type": g.get("group_type")} for g in groups]
    return Result(data, ["GROUP", "STATE", "PROTOCOL TYPE"],
                  [[d["group"], d["state"], d["protocol_type"] or "(simple)"] for d in data])


def _describe_action(admin: Any, args: argparse.Namespace) -> Result:
    d = _describe(admin, args.group)
    _say_if_unknown("describe", args.group, d)
    members = []
    for m in d["members"]:
        assignment = m.get("member_assignment") or {}
        if isinstance(assignment, dict):
            # by topic, then by partition number (as text, t-10 came before t-2)
            assigned = assignment.get("assigned_partitions") or []
            pairs = sorted((e["topic"], p) for e in assigned for p in e["partitions"])
            partitions = [f"{topic}-{p}" for topic, p in pairs]
        else:  # not a consumer's assignment (another protocol type's bytes, or damaged): kafka-python's raw value
            partitions = ["(not a consumer assignment)"]
        members.append({"member_id": m["member_id"], "group_instance_id": m.get("group_instance_id"),
                        "client_id": m["client_id"], "host": m["client_host"], "partitions": partitions})
    data = {"group": args.group, "state": d["group_state"], "protocol_type": d["protocol_type"],
            "protocol": d["protocol_data"], "members": members}
    # static members' instance ids in a column of their own when there are any, as Kafka's tool shows them
    static = any(m["group_instance_id"] for m in members)
    rows = [[args.group, d["group_state"], d["protocol_data"] or "-", m["member_id"],
             *([m["group_instance_id"] or "-"] if static else []), m["client_id"], m["host"],
             ",".join(m["partitions"]) or "-"] for m in members]
    if not rows:
        rows = [[args.group, d["group_state"], d["protocol_data"] or "-", "-", "-", "-", "-"]]
    columns = ["GROUP", "STATE", "PROTOCOL", "MEMBER", *(["GROUP-INSTANCE-ID"] if static else []), "CLIENT", "HOST",
               "PARTITIONS"]
    return Result(data, columns, rows)


def _offsets(admin: Any, group: str) -> dict[tuple[str, int], Any]:
    found = admin.list_group_offsets(group)[group]
    return {(tp.topic, tp.partition): om for tp, om in sorted(found.items())}


def _offsets_action(admin: Any, args: argparse.Namespace) -> Result:
    offsets = _offsets(admin, args.group)
    if not offsets:
        try:
            described = admin.describe_groups([args.group])[args.group]
        except Exception:  # only for a note on stderr: an answer the admin client cannot read says nothing
            described = {}
        _say_if_unknown("offsets", args.group, described)
    ends = _log_ends(admin, args, offsets)
    data = []
    for (t, p), om in offsets.items():
        end = ends.get((t, p))
        lag = end - om.offset if end is not None and om.offset >= 0 else None
        data.append({"topic": t, "partition": p, "offset": om.offset, "metadata": om.metadata,
                     "log_end_offset": end, "lag": lag})
    return Result(data, ["GROUP", "TOPIC", "PARTITION", "OFFSET", "LOG-END-OFFSET", "LAG", "METADATA"],
                  [[args.group, d["topic"], d["partition"], d["offset"], _or_dash(d["log_end_offset"]),
                    _or_dash(d["lag"]), d["metadata"] or ""] for d in data])


def _log_ends(admin: Any, args: argparse.Namespace, offsets: dict[tuple[str, int], Any]) -> dict[tuple[str, int], int]:
    """Each partition's log end, for the lag, as kafka-consumer-groups shows it; none for a topic the
    cluster does not know (a standalone kcoord knows none) or cannot say (one line on stderr)."""
    from kafka.admin import OffsetSpec
    from kafka.errors import KafkaError

    by_topic: dict[str, list[int]] = {}
    for t, p in offsets:
        by_topic.setdefault(t, []).append(p)
    ends: dict[tuple[str, int], int] = {}
    for topic, partitions in by_topic.items():
        try:
            known = _partitions_of(admin, topic)
            asked = [p for p in partitions if known is not None and p in known]
            found = _log_offsets(admin, topic, asked, OffsetSpec.LATEST)
        except KafkaError as exc:
            print(f"kcoord groups offsets: no log end offsets for {topic}: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            continue
        ends.update({(topic, p): end for p, end in (found or {}).items()})
    return ends


def _or_dash(value: int | None) -> str | int:
    return "-" if value is None else value


def _delete(admin: Any, args: argparse.Namespace) -> Result:
    outcome = admin.delete_groups([args.group])[args.group]
    if outcome != "OK":
        raise GroupsError(f"{args.group}: {outcome}")
    return Result({"group": args.group, "deleted": True}, ["GROUP", "RESULT"], [[args.group, "deleted"]])


def _committed(admin: Any, args: argparse.Namespace) -> dict[int, int]:
    """The group's committed offsets of ``--topic``, by partition."""
    return {p: om.offset for (t, p), om in _offsets(admin, args.group).items() if t == args.topic}


def _chosen(admin: Any, args: argparse.Namespace, committed: dict[int, int] | None = None) -> list[int]:
    """``--partitions``, else those with a committed offset (``committed``, when already read)."""
    if args.partitions:
        return list(args.partitions)
    chosen = sorted(_committed(admin, args) if committed is None else committed)
    if not chosen:
        raise GroupsError(f"{args.group} has no committed offset for topic {args.topic}; name --partitions")
    return chosen


def _reset(admin: Any, args: argparse.Namespace) -> Result:
    from kafka.structs import OffsetAndMetadata, TopicPartition

    state = _describe(admin, args.group)["group_state"]
    if state not in ("Empty", "Dead"):
        raise GroupsError(f"{args.group} is {state}: offsets can only be reset while the group has no members "
                          "(stop its consumers first)")
    current = _committed(admin, args)
    partitions = _chosen(admin, args, current)
    new = _targets(admin, args, partitions, current)
    if not args.dry_run:
        # per partition, not raised: a consumer joining since the check above gets UNKNOWN_MEMBER_ID, a topic
        # name no topic can have UNKNOWN_TOPIC_OR_PARTITION (the table was printed, exit 0, nothing stored)
        _raise_refusals(args, admin.alter_group_offsets(
            args.group, {TopicPartition(args.topic, p): OffsetAndMetadata(new[p], "", -1) for p in partitions}))
    data = [{"topic": args.topic, "partition": p, "previous": current.get(p), "offset": new[p]} for p in partitions]
    if args.dry_run:
        print(f"kcoord groups reset-offsets: dry run, {args.group}'s offsets are unchanged", file=sys.stderr)
    return Result(data, ["GROUP", "TOPIC", "PARTITION", "PREVIOUS OFFSET", "NEW OFFSET"],
                  [[args.group, args.topic, p, "-" if current.get(p) is None else current[p], new[p]]
                   for p in partitions])


def _targets(admin: Any, args: argparse.Namespace, partitions: list[int], current: dict[int, int]) -> dict[int, int]:
    """The new offset of each partition, as kafka-consumer-groups computes it: ``--to-datetime`` past
    the last record is the log's end, and ``--to-offset`` and ``--shift-by`` stay within the log (a
    line on stderr says where one was moved)."""
    from kafka.admin import OffsetSpec

    known = functools.cache(lambda: _partitions_of(admin, args.topic))  # read once, on the first lookup

    def lookup(spec: Any, required: bool = True) -> dict[int, int] | None:
        """ListOffsets for the chosen partitions; None (when not ``required``) if the cluster does not
        know the topic, as a standalone kcoord, which hosts no topics, does not."""
        partitions_there = known()
        lacking = [p for p in partitions if partitions_there is not None and p not in partitions_there]
        if lacking:
            raise GroupsError(f"topic {args.topic} has no partition " + ", ".join(map(str, lacking))
                              + f" at {args.bootstrap}")
        found = None if partitions_there is None else _log_offsets(admin, args.topic, partitions, spec)
        if found is None and required:
            raise GroupsError(f"{args.bootstrap} knows no topic {args.topic}: --to-earliest, --to-latest and "
                              "--to-datetime read the topic's log from the cluster's brokers (kcoord in gateway "
                              "mode, or a Kafka broker); a standalone kcoord hosts no topics")
        return found

    if args.to_offset is not None or args.shift_by is not None:
        if args.to_offset is not None:
            chosen = {p: args.to_offset for p in partitions}
        else:
            missing = [p for p in partitions if p not in current]
            if missing:
                raise GroupsError(f"{args.group} has no committed offset to shift for "
                                  + ", ".join(f"{args.topic}-{p}" for p in missing))
            chosen = {p: min(MAX_OFFSET, max(0, current[p] + args.shift_by)) for p in partitions}
        earliest, latest = lookup(OffsetSpec.EARLIEST, False), lookup(OffsetSpec.LATEST, False)
        if earliest is None or latest is None:  # a standalone kcoord: no log to stay within
            return chosen
        kept = {p: min(max(chosen[p], earliest[p]), latest[p]) for p in partitions}
        for p in partitions:
            if kept[p] != chosen[p]:
                where = "before the log's start" if chosen[p] < earliest[p] else "past the log's end"
                print(f"kcoord groups reset-offsets: {args.topic}-{p}: {chosen[p]} is {where} ({kept[p]}): "
                      f"{kept[p]} instead", file=sys.stderr)
        return kept
    if args.to_datetime is not None:
        found, latest = lookup(args.to_datetime), lookup(OffsetSpec.LATEST)
        assert found is not None and latest is not None
        return {p: found[p] if found[p] >= 0 else latest[p] for p in partitions}
    found = lookup(OffsetSpec.EARLIEST if args.to_earliest else OffsetSpec.LATEST)
    assert found is not None
    return found


def _partitions_of(admin: Any, topic: str) -> set[int] | None:
    """The topic's partitions in the cluster's metadata; None if it does not know the topic."""
    [described] = admin.describe_topics([topic])
    return None if described.get("error_code") else {p.get("partition_index") for p in described["partitions"]}


def _log_offsets(admin: Any, topic: str, partitions: list[int], spec: Any) -> dict[int, int] | None:
    """ListOffsets for the partitions, from their leaders; None if the topic is gone since its metadata."""
    from kafka.errors import UnknownTopicOrPartitionError
    from kafka.structs import TopicPartition

    if not partitions:
        return {}
    try:
        found = admin.list_partition_offsets({TopicPartition(topic, p): spec for p in partitions})
    except UnknownTopicOrPartitionError:
        return None
    return {tp.partition: found_at.offset for tp, found_at in found.items()}


def _delete_offsets(admin: Any, args: argparse.Namespace) -> Result:
    from kafka.structs import TopicPartition

    partitions = _chosen(admin, args)
    _raise_refusals(args, admin.delete_group_offsets(args.group, [TopicPartition(args.topic, p) for p in partitions]))
    return Result([{"topic": args.topic, "partition": p, "deleted": True} for p in partitions],
                  ["GROUP", "TOPIC", "PARTITION", "RESULT"],
                  [[args.group, args.topic, p, "deleted"] for p in partitions])


def _raise_refusals(args: argparse.Namespace, outcome: Any) -> None:
    """GroupsError naming every partition the coordinator refused in ``outcome``."""
    errors = _partition_errors(outcome)
    failed = {p: e for p, e in errors.items() if e not in (None, "OK", "NoError")}
    if failed:
        raise GroupsError(f"{args.group}: " + ", ".join(f"{args.topic}-{p}: {e}" for p, e in sorted(failed.items())))


def _partition_errors(outcome: Any) -> dict[int, Any]:
    """kafka-python reports per partition; errors are names, classes or instances depending on the call."""
    errors: dict[int, Any] = {}
    items = outcome.items() if isinstance(outcome, dict) else outcome or []
    for tp, error in items:
        if error is not None and not isinstance(error, str):
            error = getattr(error, "__name__", type(error).__name__)
        errors[tp.partition] = error
    return errors


ACTIONS: dict[str, Callable[[Any, argparse.Namespace], Result]] = {
    "list": _list, "describe": _describe_action, "offsets": _offsets_action, "delete": _delete,
    "reset-offsets": _reset, "delete-offsets": _delete_offsets,
}
