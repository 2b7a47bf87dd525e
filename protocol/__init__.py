"""Sans-IO Kafka wire protocol for kcoord: framing, headers, the API registry, error codes and the
``__consumer_offsets`` record schemas. Nothing here does I/O or holds state."""

from protocol.compiled import prefer_source

prefer_source()
