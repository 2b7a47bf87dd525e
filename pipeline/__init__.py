"""Spark jobs over offsets logs (kcoord's or an Apache Kafka broker's ``__consumer_offsets-*`` directories):
``snapshot``, ``history`` and ``reshard`` (see ``pipeline.cli``). Reuses ``protocol`` records and ``storage``
batches; never imports ``coordinator``. PySpark is imported only by the modules that need it, so the pure
pieces (layout, splits, decode) run and are tested without a JVM."""
