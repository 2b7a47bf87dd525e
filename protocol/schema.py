"""Kafka's JSON message schemas, read into a small typed model the code generator works from.

The schemas themselves are the ones kafka-python ships (Kafka's own ``clients/.../message/*.json``,
loaded with kafka-python's ``load_json``, which strips comments and resolves common structs); ours for
the ``__consumer_offsets`` records live in ``protocol/schemas`` and are read the same way. Field
names become Python attributes in kafka-python's spelling (``GroupId`` -> ``group_id``), so code and
tests can use either library's objects interchangeably.
"""

import re
import uuid
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

from kafka.protocol.schemas.load_json import load_json

Versions = tuple[int, int]
NO_VERSIONS: Versions = (-1, -1)
MAX_VERSION = 32767

# Fixed-width types: struct format character and size in bytes. 'bitfield' is kafka-python's name for
# the int32 authorized-operations fields it patches into a few schemas; on the wire it is an int32.
FIXED: dict[str, tuple[str, int]] = {
    "int8": ("b", 1),
    "int16": ("h", 2),
    "uint16": ("H", 2),
    "int32": ("i", 4),
    "bitfield": ("i", 4),
    "uint32": ("I", 4),
    "int64": ("q", 8),
    "float64": ("d", 8),
    "bool": ("?", 1),
    "uuid": ("16s", 16),
}
VARIABLE = ("string", "bytes", "records")
ZERO_UUID: Final = uuid.UUID(int=0)


def parse_versions(spec: str | None) -> Versions | None:
    if spec is None or not spec.strip():
        return None
    spec = spec.strip()
    if spec == "none":
        return NO_VERSIONS
    if spec.endswith("+"):
        return int(spec[:-1]), MAX_VERSION
    if "-" in spec:
        lo, hi = spec.split("-")
        return int(lo), int(hi)
    return int(spec), int(spec)


def in_versions(versions: Versions | None, version: int) -> bool:
    return versions is not None and versions[0] <= version <= versions[1]


def attribute_name(json_name: str) -> str:
    """kafka-python's attribute spelling of a schema field name."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", json_name).lower()


@dataclass(frozen=True)
class FieldSpec:
    name: str  # Python attribute
    type: str  # a FIXED or VARIABLE type, "struct", or "[]" + element type
    versions: Versions
    nullable: Versions | None
    tag: int | None
    tagged: Versions | None
    default: Any  # scalars only; struct and array values are built fresh per instance
    default_null: bool  # the schema says "default": "null" (for arrays and structs: null, not empty)
    struct: "StructSpec | None"

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def element(self) -> str:
        return self.type[2:]

    def present(self, version: int) -> bool:
        return in_versions(self.versions, version)

    def nullable_at(self, version: int) -> bool:
        return in_versions(self.nullable, version)

    def tagged_at(self, version: int) -> bool:
        return self.tag is not None and in_versions(self.tagged, version)


@dataclass(frozen=True)
class StructSpec:
    name: str
    fields: tuple[FieldSpec, ...]

    def untagged(self, version: int) -> list[FieldSpec]:
        return [f for f in self.fields if f.present(version) and not f.tagged_at(version)]

    def tagged(self, version: int) -> list[FieldSpec]:
        return sorted((f for f in self.fields if f.present(version) and f.tagged_at(version)),
                      key=lambda f: f.tag or 0)


@dataclass(frozen=True)
class MessageSpec:
    name: str
    api_key: int | None
    valid: Versions
    flexible: Versions
    root: StructSpec

    def is_flexible(self, version: int) -> bool:
        return in_versions(self.flexible, version)


def _default(type_name: str, raw: Any) -> Any:
    """The schema default as a Python value (a struct/array default is built per instance)."""
    if raw == "null":
        return None
    if type_name in ("int8", "int16", "uint16", "int32", "uint32", "int64", "bitfield"):
        return int(raw, 0) if isinstance(raw, str) and raw else 0
    if type_name == "float64":
        return float(raw) if raw else 0.0
    if type_name == "bool":
        return str(raw).lower() == "true"
    if type_name == "uuid":
        return ZERO_UUID
    if type_name == "string":
        return raw if isinstance(raw, str) else ""
    if type_name in ("bytes", "records"):
        return b""
    return None


def _field(json: dict[str, Any], parent: str) -> FieldSpec:
    type_name = json["type"]
    versions = parse_versions(json.get("versions")) or NO_VERSIONS
    nullable = parse_versions(json.get("nullableVersions"))
    struct = None
    if "fields" in json:
        element = type_name[2:] if type_name.startswith("[]") else type_name
        struct = _struct(element, json["fields"])
        type_name = "[]struct" if type_name.startswith("[]") else "struct"
    else:
        base = type_name[2:] if type_name.startswith("[]") else type_name
        if base not in FIXED and base not in VARIABLE:
            raise ValueError(f"{parent}.{json['name']}: unsupported type {json['type']!r}")
    raw_default = json.get("default", "")
    default = None if type_name.startswith(("[]", "struct")) else _default(type_name, raw_default)
    return FieldSpec(
        name=attribute_name(json["name"]),
        type=type_name,
        versions=versions,
        nullable=nullable,
        tag=json.get("tag"),
        tagged=parse_versions(json.get("taggedVersions")),
        default=default,
        default_null=raw_default == "null",
        struct=struct,
    )


def _struct(name: str, fields: list[dict[str, Any]]) -> StructSpec:
    return StructSpec(name, tuple(_field(f, name) for f in fields))


def load_message(name: str, package: ModuleType | None = None) -> MessageSpec:
    """A message schema by name: kafka-python's bundled ones, or ``package``'s own JSON files."""
    json = load_json(name, package=package)
    return MessageSpec(
        name=json["name"],
        api_key=json.get("apiKey"),
        valid=parse_versions(json.get("validVersions")) or NO_VERSIONS,
        flexible=parse_versions(json.get("flexibleVersions")) or NO_VERSIONS,
        root=_struct(json["name"], json["fields"]),
    )
