"""Null checks kafka-python's decoder does not make.

kafka-python reads a length of -1 as ``None`` whatever the version, but Kafka's parser rejects a null in
a field that is not nullable at that version (then the broker closes the connection). This module
derives, once per (API, version), which fields may hold null and checks a decoded request against it.
Only strings, bytes, arrays and structs are visited: numbers can never decode to ``None``.
"""

import functools
from typing import Any

# (attribute name, nullable at this version, plan for the elements of a struct array, or None)
_Plan = tuple[tuple[str, bool, "_Plan | None"], ...]
_NULL_CAPABLE = ("string", "bytes", "records", "[]")


def _plan(struct: Any, version: int) -> _Plan:
    entries = []
    for field in struct.fields.values():
        if not field.for_version_q(version) or field.tagged_field_q(version):
            continue
        type_str = field._type_str
        if not type_str.startswith(_NULL_CAPABLE) and not field.is_struct():
            continue
        child = _plan(field, version) if field.is_struct_array() else None
        entries.append((field.name, bool(field.nullable_for_version_q(version)), child))
    return tuple(entries)


@functools.cache
def _plan_for(message_class: Any, version: int) -> _Plan:
    return _plan(message_class._struct, version)


def null_violation(message_class: Any, message: Any, version: int) -> str | None:
    """The path of the first non-nullable field holding null, or None when the message is valid."""
    return _check(_plan_for(message_class, version), message, "")


def _check(plan: _Plan, obj: Any, prefix: str) -> str | None:
    for name, nullable, child in plan:
        value = getattr(obj, name)
        if value is None:
            if not nullable:
                return prefix + name
            continue
        if child:
            for i, element in enumerate(value):
                found = _check(child, element, f"{prefix}{name}[{i}].")
                if found:
                    return found
    return None
