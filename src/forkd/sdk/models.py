"""The REST API's request and response bodies as ``TypedDict``s, under their public name.

Generated from the daemon's OpenAPI document into ``forkd/sdk/_generated/models.py``
by ``scripts/gen_sdk_models.py`` (the folder holds only generated modules, so none
is edited by hand); ``forkd.sdk.models`` is where users and the SDK import them.
"""

from forkd.sdk._generated.models import *  # noqa: F403
from forkd.sdk._generated.models import __all__ as __all__
