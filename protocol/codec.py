"""Decoders and encoders generated from Kafka's JSON message schemas, one pair per message and version.

Why generate: a generic schema walker spends most of a small request's time dispatching on field types
(kafka-python's generic path: ~17 us for an OffsetCommit). Here each (message, version) gets straight-line
Python source, compiled once: consecutive fixed-width fields are one ``struct`` call, nested structs
and arrays are inlined, absent fields take their schema defaults, and an empty tagged-field section
costs one byte test.

Why not kafka-python's own compiled codecs: they read varints without a length limit (a run of 0xFF
bytes grows one Python integer quadratically) and copy the rest of the frame for every tagged-field
section. Decoding here is linear in the frame size by construction:

* an unsigned varint is at most 5 bytes (Kafka's ``readUnsignedVarint``); longer is malformed;
* every length and count is checked against the bytes left before anything is read or allocated
  (Kafka: "Tried to allocate a collection of size N, but there are only M bytes remaining");
* a tagged field is skipped or decoded in place, never copied out;
* a null in a field that is not nullable at the version is refused (Kafka's parser does the same).

Decoded messages are instances of classes generated per struct with ``__slots__`` and kafka-python's
attribute names; handlers build responses from the same classes (keyword arguments, schema defaults).
"""

import struct
import uuid
from collections.abc import Callable
from typing import Any, Final

from protocol.schema import FIXED, ZERO_UUID, FieldSpec, MessageSpec, StructSpec

MAX_UVARINT_BYTES = 5
MAX_COMPACT_STRING: Final = 0x7FFF  # Kafka refuses longer compact strings, as int16-length ones cannot be


class DecodeError(ValueError):
    """Bytes that are not a valid message of the version being decoded."""


class EncodeError(ValueError):
    """A message object that cannot be encoded at the requested version (a handler bug)."""


def read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    """Unsigned LEB128 of at most 5 bytes starting at ``pos``; returns (value, next position)."""
    value = shift = 0
    for i in range(MAX_UVARINT_BYTES):
        try:
            b = buf[pos + i]
        except IndexError:
            raise DecodeError("varint runs past the end of the frame") from None
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos + i + 1
        shift += 7
    raise DecodeError(f"varint longer than {MAX_UVARINT_BYTES} bytes")


_UV1 = [bytes((i,)) for i in range(128)]


def write_uvarint(n: int) -> bytes:
    if n < 0x80:
        return _UV1[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# -- generated classes ------------------------------------------------------------------------------

_MISSING: Any = object()


class Message:
    """Base of every generated struct class: equality and repr over the schema fields."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, f) == getattr(other, f) for f in self._fields)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({inner})"


def _build_class(st: StructSpec, classes: dict[str, type]) -> type:
    """A slotted class for ``st`` (and, first, for its nested structs, attached as attributes)."""
    nested = {}
    for f in st.fields:
        if f.struct is not None:
            nested[f.struct.name] = classes.get(f.struct.name) or _build_class(f.struct, classes)
    names = tuple(f.name for f in st.fields)
    env: dict[str, Any] = {"_MISSING": _MISSING}
    params, body = [], []
    for i, f in enumerate(st.fields):
        if f.is_array:
            fresh = "None" if f.default_null else "[]"
            params.append(f"{f.name}=_MISSING")
            body.append(f"    self.{f.name} = {fresh} if {f.name} is _MISSING else {f.name}")
        elif f.type == "struct":
            assert f.struct is not None
            env[f"_C{i}"] = nested[f.struct.name]
            fresh = "None" if f.default_null else f"_C{i}()"
            params.append(f"{f.name}=_MISSING")
            body.append(f"    self.{f.name} = {fresh} if {f.name} is _MISSING else {f.name}")
        else:
            env[f"_D{i}"] = f.default
            params.append(f"{f.name}=_D{i}")
            body.append(f"    self.{f.name} = {f.name}")
    src = f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or "    pass")
    exec(compile(src, f"<kcoord-codec:{st.name}.__init__>", "exec"), env)
    cls = type(st.name, (Message,), {"__slots__": names, "_fields": names, "__init__": env["__init__"]})
    for name, child in nested.items():
        setattr(cls, name, child)
    classes[st.name] = cls
    return cls


JOIN_RUN = 4096


def join_parts(parts: list[bytes]) -> bytes:
    """``b"".join`` in runs: it takes a buffer view of every part first (~80 bytes each) and holds the
    GIL throughout. Measured on 600k parts (a 150k-partition response): 60 ms in one piece, during which
    the event loop waits; 15 ms in runs of JOIN_RUN, with a chance to switch threads between runs."""
    if len(parts) <= JOIN_RUN:
        return b"".join(parts)
    return b"".join([b"".join(parts[i:i + JOIN_RUN]) for i in range(0, len(parts), JOIN_RUN)])


# -- code emission ----------------------------------------------------------------------------------


class _Emitter:
    def __init__(self, classes: dict[str, type]) -> None:
        self.lines: list[str] = []
        self.env: dict[str, Any] = {
            "DecodeError": DecodeError,
            "EncodeError": EncodeError,
            "_uvr": read_uvarint,
            "_uvw": write_uvarint,
            "_UV1": _UV1,
            "_UUID": uuid.UUID,
            "_ZERO_UUID": ZERO_UUID,
            "_MISSING": _MISSING,
            "_join": join_parts,
        }
        self.classes = classes
        self._n = 0

    def var(self, hint: str) -> str:
        self._n += 1
        return f"_{hint}{self._n}"

    def const(self, value: Any, hint: str = "k") -> str:
        name = self.var(hint)
        self.env[name] = value
        return name

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def compile(self, name: str, entry: str) -> Callable[..., Any]:
        exec(compile("\n".join(self.lines), f"<kcoord-codec:{name}>", "exec"), self.env)
        fn: Callable[..., Any] = self.env[entry]
        return fn


def _fixed_runs(fields: list[FieldSpec]) -> list[list[FieldSpec]]:
    """Consecutive fixed-width fields grouped, so each group is one ``struct`` call."""
    runs: list[list[FieldSpec]] = []
    for f in fields:
        if f.type in FIXED and runs and runs[-1][0].type in FIXED:
            runs[-1].append(f)
        else:
            runs.append([f])
    return runs


# -- decoding ---------------------------------------------------------------------------------------


def _emit_uvarint(em: _Emitter, ind: int, var: str) -> None:
    em.emit(ind, f"{var} = buf[pos]")
    em.emit(ind, "pos += 1")
    em.emit(ind, f"if {var} & 0x80:")
    em.emit(ind + 1, f"{var}, pos = _uvr(buf, pos - 1)")


def _emit_length(em: _Emitter, ind: int, var: str, compact: bool, wide: bool) -> None:
    """Reads a length/count into ``var``; -1 stands for null in both encodings."""
    if compact:
        _emit_uvarint(em, ind, var)
        em.emit(ind, f"{var} -= 1")
    else:
        fmt = em.const(struct.Struct(">i" if wide else ">h").unpack_from, "len")
        em.emit(ind, f"{var} = {fmt}(buf, pos)[0]")
        em.emit(ind, f"pos += {4 if wide else 2}")


def _emit_null_or_fail(em: _Emitter, ind: int, n: str, var: str, f: FieldSpec, version: int, what: str) -> None:
    em.emit(ind, f"if {n} < 0:")
    if f.nullable_at(version):
        em.emit(ind + 1, f"if {n} != -1: raise DecodeError('{what} {f.name}: negative length ' + str({n}))")
        em.emit(ind + 1, f"{var} = None")
    else:
        em.emit(ind + 1, f"raise DecodeError('{what} {f.name} is null or negative (' + str({n}) + ')')")


def _emit_read_bytes(em: _Emitter, ind: int, f: FieldSpec, var: str, version: int, compact: bool,
                     kind: str) -> None:
    n = em.var("n")
    _emit_length(em, ind, n, compact, wide=kind != "string")
    _emit_null_or_fail(em, ind, n, var, f, version, kind)
    em.emit(ind, "else:")
    if kind == "string" and compact:
        em.emit(ind + 1, f"if {n} > {MAX_COMPACT_STRING}: raise DecodeError('string {f.name} too long')")
    em.emit(ind + 1, f"_e = pos + {n}")
    em.emit(ind + 1, f"if _e > blen: raise DecodeError('{f.name} runs past the end of the frame')")
    if kind == "string":
        # bytes that are not UTF-8 are replaced, as Kafka's readString (new String(bytes, UTF_8)) reads them
        em.emit(ind + 1, f"{var} = buf[pos:_e].decode('utf-8', 'replace')")
    else:
        em.emit(ind + 1, f"{var} = bytes(buf[pos:_e])")
    em.emit(ind + 1, "pos = _e")


def _emit_read_array(em: _Emitter, ind: int, f: FieldSpec, var: str, version: int, compact: bool,
                     flexible: bool) -> None:
    n = em.var("n")
    _emit_length(em, ind, n, compact, wide=True)
    _emit_null_or_fail(em, ind, n, var, f, version, "array")
    em.emit(ind, "else:")
    em.emit(ind + 1, f"if {n} > blen - pos: raise DecodeError('array {f.name} of ' + str({n}) + ' elements "
                     "cannot fit in the bytes left')")
    elem = f.element
    if elem in FIXED and elem not in ("uuid", "bool"):
        code, size = FIXED[elem]
        em.emit(ind + 1, f"{var} = list(_unpack('>' + str({n}) + '{code}', buf, pos))")
        em.emit(ind + 1, f"pos += {n} * {size}")
        em.env["_unpack"] = struct.unpack_from
        return
    item = em.var("it")
    em.emit(ind + 1, f"{var} = []")
    em.emit(ind + 1, f"_app{item} = {var}.append")
    em.emit(ind + 1, f"for _ in range({n}):")
    if elem == "struct":
        assert f.struct is not None
        _emit_decode_struct(em, ind + 2, f.struct, item, version, flexible, nullable=False)
    else:
        elem_field = FieldSpec(f.name + "[]", elem, f.versions, None, None, None, None, False, None)
        _emit_read_value(em, ind + 2, elem_field, item, version, compact, flexible)
    em.emit(ind + 2, f"_app{item}({item})")


def _emit_read_value(em: _Emitter, ind: int, f: FieldSpec, var: str, version: int, compact: bool,
                     flexible: bool) -> None:
    """Decodes one field's value (not fixed-run grouped) into ``var``."""
    if f.type in FIXED:
        code, size = FIXED[f.type]
        unpack = em.const(struct.Struct(">" + code).unpack_from, "u")
        em.emit(ind, f"{var} = {unpack}(buf, pos)[0]")
        em.emit(ind, f"pos += {size}")
        if f.type == "uuid":
            em.emit(ind, f"{var} = _UUID(bytes={var})")
    elif f.type in ("string", "bytes", "records"):
        _emit_read_bytes(em, ind, f, var, version, compact, "string" if f.type == "string" else "bytes")
    elif f.is_array:
        _emit_read_array(em, ind, f, var, version, compact, flexible)
    else:
        assert f.struct is not None
        _emit_decode_struct(em, ind, f.struct, var, version, flexible, nullable=f.nullable_at(version))


def _emit_decode_struct(em: _Emitter, ind: int, st: StructSpec, out: str, version: int, flexible: bool,
                        nullable: bool) -> None:
    """Inline decoding of one struct into ``out``; absent fields get their defaults."""
    if nullable:  # KIP-893 nullable struct: int8 prefix, -1 is null
        em.emit(ind, "_p = buf[pos]")
        em.emit(ind, "pos += 1")
        em.emit(ind, "if _p == 255:")
        em.emit(ind + 1, f"{out} = None")
        em.emit(ind, "else:")
        ind += 1
    values: dict[str, str] = {}
    for run in _fixed_runs(st.untagged(version)):
        if run[0].type in FIXED:
            fmt = ">" + "".join(FIXED[f.type][0] for f in run)
            s = struct.Struct(fmt)
            unpack = em.const(s.unpack_from, "s")
            names = [em.var(f.name) for f in run]
            em.emit(ind, f"{', '.join(names)}{',' if len(names) == 1 else ''} = {unpack}(buf, pos)")
            em.emit(ind, f"pos += {s.size}")
            for f, v in zip(run, names, strict=True):
                if f.type == "uuid":
                    em.emit(ind, f"{v} = _UUID(bytes={v})")
                values[f.name] = v
        else:
            f = run[0]
            v = em.var(f.name)
            _emit_read_value(em, ind, f, v, version, flexible, flexible)
            values[f.name] = v
    tagged = st.tagged(version)
    for f in tagged:
        v = em.var(f.name)
        em.emit(ind, f"{v} = {_default_expr(em, f)}")
        values[f.name] = v
    if flexible:
        _emit_read_tags(em, ind, tagged, values, version)
    cls = em.const(em.classes[st.name], "C")
    args = ", ".join(values.get(f.name) or _default_expr(em, f) for f in st.fields)
    em.emit(ind, f"{out} = {cls}({args})")


def _default_expr(em: _Emitter, f: FieldSpec) -> str:
    if f.is_array:
        return "None" if f.default_null else "[]"
    if f.type == "struct":
        assert f.struct is not None
        return "None" if f.default_null else f"{em.const(em.classes[f.struct.name], 'C')}()"
    if f.default is None or isinstance(f.default, (bool, int, float)):
        return repr(f.default)
    return em.const(f.default, "d")


def _emit_read_tags(em: _Emitter, ind: int, tagged: list[FieldSpec], values: dict[str, str], version: int) -> None:
    """The tagged-field section: known tags decoded in place, unknown ones skipped without a copy.
    Its temporaries are named per section: a known tagged struct has a tag section of its own."""
    nt, tag, end = em.var("nt"), em.var("tag"), em.var("end")
    em.emit(ind, f"{nt} = buf[pos]")
    em.emit(ind, "pos += 1")
    em.emit(ind, f"if {nt}:")
    em.emit(ind + 1, f"if {nt} & 0x80: {nt}, pos = _uvr(buf, pos - 1)")
    em.emit(ind + 1, f"if {nt} > blen - pos: raise DecodeError('more tagged fields than bytes left')")
    em.emit(ind + 1, f"for _ in range({nt}):")
    em.emit(ind + 2, f"{tag}, pos = _uvr(buf, pos)")
    em.emit(ind + 2, f"{end}, pos = _uvr(buf, pos)")
    em.emit(ind + 2, f"{end} += pos")
    em.emit(ind + 2, f"if {end} > blen: raise DecodeError('tagged field runs past the end of the frame')")
    for i, f in enumerate(tagged):
        em.emit(ind + 2, f"{'if' if i == 0 else 'elif'} {tag} == {f.tag}:")
        _emit_read_value(em, ind + 3, f, values[f.name], version, True, True)
        em.emit(ind + 3, f"if pos > {end}: raise DecodeError('tagged field longer than its size')")
    em.emit(ind + 2, f"pos = {end}")


# -- encoding ---------------------------------------------------------------------------------------


def _emit_write_length(em: _Emitter, ind: int, expr: str, compact: bool, wide: bool) -> None:
    if compact:
        em.emit(ind, f"_ln = {expr} + 1")
        em.emit(ind, "_ap(_UV1[_ln] if _ln < 128 else _uvw(_ln))")
    else:
        pack = em.const(struct.Struct(">i" if wide else ">h").pack, "p")
        em.emit(ind, f"_ap({pack}({expr}))")


def _emit_write_null(em: _Emitter, ind: int, f: FieldSpec, version: int, compact: bool, wide: bool) -> None:
    if f.nullable_at(version):
        null = b"\x00" if compact else (b"\xff\xff\xff\xff" if wide else b"\xff\xff")
        em.emit(ind, f"_ap({null!r})")
    else:
        em.emit(ind, f"raise EncodeError('{f.name} is None but not nullable at v{version}')")


def _emit_write_value(em: _Emitter, ind: int, f: FieldSpec, expr: str, version: int, compact: bool,
                      flexible: bool) -> None:
    if f.type in FIXED:
        pack = em.const(struct.Struct(">" + FIXED[f.type][0]).pack, "p")
        em.emit(ind, f"_ap({pack}({_fixed_value(f, expr)}))")
        return
    v = em.var("v")
    em.emit(ind, f"{v} = {expr}")
    em.emit(ind, f"if {v} is None:")
    is_struct = f.type == "struct"
    if is_struct and f.nullable_at(version):
        em.emit(ind + 1, "_ap(b'\\xff')")
    elif is_struct:
        em.emit(ind + 1, f"raise EncodeError('{f.name} is None but not nullable at v{version}')")
    else:
        _emit_write_null(em, ind + 1, f, version, compact, wide=f.type != "string")
    em.emit(ind, "else:")
    if f.type == "string":
        b = em.var("b")
        em.emit(ind + 1, f"{b} = {v}.encode()")
        _emit_write_length(em, ind + 1, f"len({b})", compact, wide=False)
        em.emit(ind + 1, f"_ap({b})")
    elif f.type in ("bytes", "records"):
        _emit_write_length(em, ind + 1, f"len({v})", compact, wide=True)
        em.emit(ind + 1, f"_ap(bytes({v}))")
    elif f.is_array:
        _emit_write_length(em, ind + 1, f"len({v})", compact, wide=True)
        item = em.var("it")
        em.emit(ind + 1, f"for {item} in {v}:")
        if f.element == "struct":
            assert f.struct is not None
            _emit_encode_struct(em, ind + 2, f.struct, item, version, flexible)
        else:
            elem = FieldSpec(f.name + "[]", f.element, f.versions, None, None, None, None, False, None)
            _emit_write_value(em, ind + 2, elem, item, version, compact, flexible)
    else:
        assert f.struct is not None
        if f.nullable_at(version):
            em.emit(ind + 1, "_ap(b'\\x01')")
        _emit_encode_struct(em, ind + 1, f.struct, v, version, flexible)


def _fixed_value(f: FieldSpec, expr: str) -> str:
    if f.type == "uuid":
        return f"({expr} or _ZERO_UUID).bytes"
    return expr


def _emit_encode_struct(em: _Emitter, ind: int, st: StructSpec, obj: str, version: int, flexible: bool) -> None:
    for run in _fixed_runs(st.untagged(version)):
        if run[0].type in FIXED:
            pack = em.const(struct.Struct(">" + "".join(FIXED[f.type][0] for f in run)).pack, "p")
            args = ", ".join(_fixed_value(f, f"{obj}.{f.name}") for f in run)
            em.emit(ind, f"_ap({pack}({args}))")
        else:
            _emit_write_value(em, ind, run[0], f"{obj}.{run[0].name}", version, flexible, flexible)
    if not flexible:
        return
    tagged = st.tagged(version)
    if not tagged:
        em.emit(ind, "_ap(b'\\x00')")
        return
    tags = em.var("tags")
    em.emit(ind, f"{tags} = []")
    for f in tagged:
        v = em.var("tv")
        em.emit(ind, f"{v} = {obj}.{f.name}")
        saved, sub = em.var("saved"), em.var("sub")  # unique per level: tagged structs nest
        em.emit(ind, f"if {v} != {_default_expr(em, f)}:")
        em.emit(ind + 1, f"{saved} = _ap")
        em.emit(ind + 1, f"{sub} = []")
        em.emit(ind + 1, f"_ap = {sub}.append")
        _emit_write_value(em, ind + 1, f, v, version, True, True)
        em.emit(ind + 1, f"_ap = {saved}")
        em.emit(ind + 1, f"{tags}.append(({f.tag}, b''.join({sub})))")
    em.emit(ind, f"_ap(_uvw(len({tags})))")
    em.emit(ind, f"for _t, _tb in {tags}:")
    em.emit(ind + 1, "_ap(_uvw(_t))")
    em.emit(ind + 1, "_ap(_uvw(len(_tb)))")
    em.emit(ind + 1, "_ap(_tb)")


# -- public -----------------------------------------------------------------------------------------

Decoder = Callable[[bytes, int], tuple[Any, int]]
Encoder = Callable[[Any], bytes]


class MessageCodec:
    """Generated classes, decoders and encoders of one message schema, per version on first use."""

    def __init__(self, spec: MessageSpec) -> None:
        self.spec = spec
        self.classes: dict[str, type] = {}
        self.cls: Any = _build_class(spec.root, self.classes)  # generated: attributes unknown to mypy
        self._decoders: dict[int, Decoder] = {}
        self._encoders: dict[int, Encoder] = {}

    def decoder(self, version: int) -> Decoder:
        fn = self._decoders.get(version)
        if fn is None:
            em = _Emitter(self.classes)
            em.emit(0, "def decode(buf, pos):")
            em.emit(1, "blen = len(buf)")
            _emit_decode_struct(em, 1, self.spec.root, "_msg", version, self.spec.is_flexible(version), False)
            em.emit(1, "return _msg, pos")
            fn = self._decoders[version] = em.compile(f"{self.spec.name}.decode.v{version}", "decode")
        return fn

    def encoder(self, version: int) -> Encoder:
        fn = self._encoders.get(version)
        if fn is None:
            em = _Emitter(self.classes)
            em.emit(0, "def encode(msg):")
            em.emit(1, "_out = []")
            em.emit(1, "_ap = _out.append")
            _emit_encode_struct(em, 1, self.spec.root, "msg", version, self.spec.is_flexible(version))
            em.emit(1, f"return b''.join(_out) if len(_out) <= {JOIN_RUN} else _join(_out)")
            fn = self._encoders[version] = em.compile(f"{self.spec.name}.encode.v{version}", "encode")
        return fn

    def decode(self, buf: bytes, version: int, pos: int = 0) -> tuple[Any, int]:
        """Decodes at ``pos``; any malformation is a DecodeError, never another exception type."""
        try:
            return self.decoder(version)(buf, pos)
        except DecodeError:
            raise
        except (struct.error, IndexError, UnicodeDecodeError, ValueError, OverflowError) as exc:
            raise DecodeError(f"{self.spec.name} v{version}: {exc}") from exc

    def encode(self, msg: Any, version: int) -> bytes:
        return self.encoder(version)(msg)
