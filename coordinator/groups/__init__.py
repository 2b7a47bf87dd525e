"""Classic consumer groups: the group model, membership (join, sync, heartbeat, leave), the admin
operations and offset retention, all as operations run through a shard."""
