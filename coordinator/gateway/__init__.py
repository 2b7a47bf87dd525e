"""Gateway mode (``kcoord serve --upstream HOST:PORT``): kcoord fronts a Kafka-compatible cluster, relays
its data path and answers every group API itself from its own durable offsets log.

Modules, lowest first: ``upstream`` (a connection to one upstream broker), ``rewrite`` (the replies that
carry broker addresses, and the API versions offered), ``cluster`` (the upstream's brokers and kcoord's
listener for each), ``metrics``, and ``relay`` (routing each request; plugged into the server).
"""
