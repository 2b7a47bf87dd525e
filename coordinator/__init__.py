"""kcoord's asyncio server and domain: connections, dispatch, per-partition shards, offsets state."""
