"""Bodies of secrets (``/v1/secrets``): a value goes in, and nothing ever gives it back
(controller/secrets.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from forkd import bounds
from forkd.api.schemas.common import RequestModel, ResponseModel

SecretName = Annotated[str, StringConstraints(pattern=bounds.SECRET_NAME_PATTERN)]
SecretValue = Annotated[str, StringConstraints(min_length=1, max_length=bounds.MAX_SECRET_VALUE_BYTES)]
MetaKey = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[^\x00]*$")]
MetaValue = Annotated[str, StringConstraints(max_length=1024, pattern=r"^[^\x00]*$")]


class CreateSecretRequest(RequestModel):
    name: SecretName = Field(description="Its name, as `${secrets.NAME}` will name it.",
                             examples=["API_TOKEN"])
    value: SecretValue = Field(description="Its value: write-only, sealed at rest, never returned or logged.")
    metadata: dict[MetaKey, MetaValue] = Field(default_factory=dict, max_length=bounds.MAX_SECRET_METADATA,
                                               description="Your own labels, returned as given.")


class UpdateSecretRequest(RequestModel):
    value: SecretValue | None = Field(None, description="A new value (its version goes up by one).")
    metadata: dict[MetaKey, MetaValue] | None = Field(None, max_length=bounds.MAX_SECRET_METADATA,
                                                      description="New labels, replacing the old.")


class SecretInfo(ResponseModel):
    """A secret as every API shows it: never its value."""

    name: str
    version: int = Field(description="1 when made; one more at each new value.")
    metadata: dict[str, str]
    created_at_unix: float
    updated_at_unix: float
