"""The one list of APIs and versions kcoord serves.

Each API module (``coordinator/apis/kNN_*.py``) registers itself once with its key, name and version
range; that registration builds the API's generated codecs and is what the ApiVersions answer, the
server's version check and the dispatcher all read, so they cannot drift apart. Schemas may define
versions below our floor (kafka-python's schemas keep the fields of removed versions), so the floor and
ceiling enforced here are ours, checked before anything is decoded.
"""

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from protocol import compiled, hotcodec
from protocol.codec import DecodeError, MessageCodec, read_uvarint
from protocol.header import response_header
from protocol.schema import load_message

__all__ = ["API_VERSIONS", "REGISTRY", "ApiSpec", "DecodeError", "api_versions_fallback", "register",
           "supported_versions"]

T = TypeVar("T")

API_VERSIONS: Final = 18
_SIZE: Final = struct.Struct(">i")
_INT16: Final = struct.Struct(">h")
_HEADER_FIXED: Final = 8  # api key, api version, correlation id
# The hand-written codecs of the hottest APIs (protocol/hotcodec.py) replace the generated ones only
# compiled and up to date (interpreted they are no faster); KCOORD_PURE_PYTHON=1 turns them off too.
HOT_CODECS: Final = (hotcodec.compiled() and not compiled.stale(hotcodec)
              and not compiled.pure_python_forced())


@dataclass(frozen=True)
class ApiSpec:
    """One served API: its key, name, version range and generated request/response codecs."""

    key: int
    name: str
    min_version: int
    max_version: int
    request: MessageCodec
    response: MessageCodec
    hot: Any = None  # a protocol.hotcodec codec for every served version, or None (its decoder replaces
    # the generated one here; its encoder takes the API's own answers, coordinator/apis/k08 and k09)

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def decode_request(self, frame: bytes, version: int) -> tuple[str, Any]:
        """``(client id, body)`` of a whole request frame (header included); DecodeError if malformed.
        Request header v2 (flexible versions) adds a tagged-field section after the client id, which is
        always an int16-length string; a null client id reads as ""."""
        if self.hot is not None:
            decoded: tuple[str, Any] = self.hot_decoded(self.hot.decode, frame, version)
            return decoded
        pos, client_id = _read_client_id(frame)
        flexible = self.request.spec.is_flexible(version)
        if flexible:
            pos = skip_tagged_fields(frame, pos)
        body, _ = self.request.decode(frame, version, pos)
        return client_id, body

    def hot_decoded(self, decode: Callable[[bytes, int], T], frame: bytes, version: int) -> T:
        """``decode(frame, version)``, a hot codec's decoder, whose refusals of malformed bytes (an index
        past the end, bad UTF-8, a negative length) become DecodeError, as the generated codecs raise."""
        try:
            return decode(frame, version)
        except DecodeError:
            raise
        except (IndexError, UnicodeDecodeError, ValueError, OverflowError) as exc:
            raise DecodeError(f"{self.name} v{version}: {exc}") from exc

    def encode_response(self, body: Any, version: int, correlation_id: int) -> bytes:
        """Size, header (v0 for ApiVersions per KIP-511, else v1 when flexible) and body."""
        flexible = self.key != API_VERSIONS and self.response.spec.is_flexible(version)
        payload = self.response.encode(body, version)
        head = response_header(correlation_id, flexible)
        return _SIZE.pack(len(head) + len(payload)) + head + payload


def _read_client_id(frame: bytes) -> tuple[int, str]:
    try:
        (n,) = _INT16.unpack_from(frame, _HEADER_FIXED)
    except struct.error:
        raise DecodeError("request header ends before its client id") from None
    pos = _HEADER_FIXED + 2
    if n < 0:  # null, as Kafka's RequestHeader reads any negative length
        return pos, ""
    end = pos + n
    if end > len(frame):
        raise DecodeError("client id runs past the end of the frame")
    return end, frame[pos:end].decode("utf-8", "replace")  # as Kafka's readString: bad bytes replaced


def skip_tagged_fields(buf: bytes, pos: int) -> int:
    """Skips a tagged-field section without copying it; bounded like every other read."""
    count, pos = read_uvarint(buf, pos)
    if count > len(buf) - pos:
        raise DecodeError("more tagged fields than bytes left")
    for _ in range(count):
        _, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise DecodeError("tagged field runs past the end of the frame")
    return pos


REGISTRY: Final[dict[int, ApiSpec]] = {}


def register(key: int, name: str, min_version: int, max_version: int) -> ApiSpec:
    """Registers an API served at ``min_version``..``max_version``. Its per-version codecs are built on
    first use: building every served version of every API took 70-110 ms of each start (restart time
    is what users wait on), and the schemas are those of the pinned kafka-python, every served version
    of which the tests build and check against kafka-python's own classes."""
    request = MessageCodec(load_message(name + "Request"))
    response = MessageCodec(load_message(name + "Response"))
    for codec in (request, response):
        if codec.spec.api_key != key:
            raise ValueError(f"{codec.spec.name} has api key {codec.spec.api_key}, not {key}")
        if max_version > codec.spec.valid[1]:
            raise ValueError(f"{codec.spec.name} defines no v{max_version}")
    hot = hotcodec.codec_for(key, request.cls) if HOT_CODECS and max_version <= hotcodec.MAX_VERSION else None
    spec = ApiSpec(key, name, min_version, max_version, request, response, hot)
    REGISTRY[key] = spec
    return spec


def supported_versions() -> list[tuple[int, int, int]]:
    """``(api_key, min_version, max_version)`` for every served API, in key order."""
    return [(s.key, s.min_version, s.max_version) for s in sorted(REGISTRY.values(), key=lambda s: s.key)]


def api_versions_fallback(correlation_id: int) -> bytes:
    """KIP-511 answer to a too-new ApiVersions: header v0, v0 body, UNSUPPORTED_VERSION(35) and only
    ApiVersions' own range, so the client retries with a version we speak."""
    spec = REGISTRY[API_VERSIONS]
    cls = spec.response.cls
    entry = cls.ApiVersion(api_key=API_VERSIONS, min_version=spec.min_version, max_version=spec.max_version)
    return spec.encode_response(cls(error_code=35, api_keys=[entry]), 0, correlation_id)
