"""Request bodies of what builds guest images and templates: a registry pull (``POST /v1/images``)
and a Dockerfile build (``POST /v1/templates``), with the registry credentials both take.
Strict and closed to unknown fields, as every request model (``RequestModel``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from forkd import bounds
from forkd.api.schemas.common import (
    DIGEST_PATTERN,
    INTERNET_HELP,
    NETWORK_HELP,
    NO_NUL_PATTERN,
    NON_EMPTY_NO_NUL_PATTERN,
    BuildArgs,
    JSONInt,
    NetworkPolicy,
    RequestModel,
    Tag,
)
from forkd.config import DEFAULT_MEM_MIB, DEFAULT_VCPUS
from forkd.image.oci import Credentials


class RegistryAuth(RequestModel):
    """A registry's user name and password or token, as Docker's config.json holds them."""

    username: Annotated[str, StringConstraints(pattern=NON_EMPTY_NO_NUL_PATTERN, max_length=256)] = Field(
        description="The user name.")
    password: Annotated[str, StringConstraints(pattern=NON_EMPTY_NO_NUL_PATTERN, max_length=4096)] = Field(
        description="The password or token.")

    def credentials(self) -> Credentials:
        """As the pull takes them (used for one pull alone, never stored)."""
        return Credentials(self.username, self.password)


class TemplateBuildRequest(RequestModel):
    tag: Tag = Field(description="Name of the template's snapshot.", examples=["web"])
    dockerfile: Annotated[str, StringConstraints(pattern=NO_NUL_PATTERN,
                                                 max_length=bounds.MAX_DOCKERFILE_BYTES)] = Field(
        description="The Dockerfile's text: FROM (a forkd image), RUN, COPY/ADD, ENV, ARG, WORKDIR, USER "
        "(docs/TEMPLATES.md).",
    )
    context: Annotated[str, StringConstraints(pattern=DIGEST_PATTERN)] | None = Field(
        None, description="The build context COPY reads: the digest PUT /v1/templates/contexts answered.",
    )
    build_args: BuildArgs = Field(default_factory=dict, description="Values of the Dockerfile's ARGs.")
    mem_mib: JSONInt = Field(DEFAULT_MEM_MIB, **bounds.MEM_MIB.field_kwargs(),
                             description="Guest RAM in MiB.")
    vcpus: JSONInt = Field(DEFAULT_VCPUS, **bounds.VCPUS.field_kwargs(), description="Guest vCPUs.")
    nic: bool = Field(False, description="Give the template, and so every child, a network device.")
    allow_internet_access: bool = Field(False, description="The build's own egress while RUN steps run "
                                        "(e.g. pip install). " + INTERNET_HELP)
    network: NetworkPolicy | None = Field(None, description="The build's own egress. " + NETWORK_HELP)
    replace: bool = Field(False, description="Replace an existing snapshot of this tag once the build "
                          "has succeeded.")
    step_timeout_secs: float = Field(1800, **bounds.EXEC_TIMEOUT_SECS.field_kwargs(),
                                     description="Timeout of each RUN and COPY step.")
    boot_wait_secs: float = Field(180, **bounds.BOOT_WAIT_SECS.field_kwargs(),
                                  description="Upper bound on the base layer's boot.")
    registry_auth: RegistryAuth | None = Field(
        None, description="For a FROM of a private registry: its credentials (this build's pull only, "
        "never stored).")


# The characters of an image reference (registry host and port, path, tag, digest); its grammar,
# with Docker's reading of a first part that is not a registry, is image/oci.py's ImageRef.parse.
IMAGE_REF_CHARS = r"^(docker://)?[A-Za-z0-9\[][A-Za-z0-9._:/@\[\]-]*$"


class ImagePullRequest(RequestModel):
    ref: Annotated[str, StringConstraints(pattern=IMAGE_REF_CHARS, max_length=512)] = Field(
        description="The image: registry/name:tag or name@sha256:…; Docker Hub's short names "
        "(python:3.12 is docker.io/library/python:3.12).", examples=["python:3.12-slim"])
    name: Tag | None = Field(None, description="The guest image's name here (default: the reference's "
                             "last part and tag, e.g. python-3.12-slim).")
    registry_auth: RegistryAuth | None = Field(None, description="The registry's credentials (this pull "
                                               "only, never stored).")
    force: bool = Field(False, description="Convert again even if this image was converted from the same "
                        "digest.")


__all__ = ["ImagePullRequest", "RegistryAuth", "TemplateBuildRequest"]
