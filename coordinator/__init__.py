"""kcoord's asyncio server and domain: connections, dispatch, per-partition shards, offsets state."""

from protocol.compiled import prefer_source

prefer_source()
