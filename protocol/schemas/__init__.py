"""kcoord's own JSON schemas for the ``__consumer_offsets`` record keys and values, written from the
field lists in the reference (section 7); loaded by kafka-python's schema machinery."""
