# GENERATED from src/forkd/sdk/async_routes/__init__.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
"""The REST client's routes, a part per resource; :class:`~forkd.sdk._generated.client.Controller`
is them all together (the sync twins in ``forkd.sdk._generated.routes`` are generated)."""
