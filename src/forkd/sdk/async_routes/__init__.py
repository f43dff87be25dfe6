"""The REST client's routes, a part per resource; :class:`~forkd.sdk.async_client.AsyncController`
is them all together (the sync twins in ``forkd.sdk._generated.routes`` are generated)."""
