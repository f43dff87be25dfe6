"""E2B template names as forkd snapshot tags: ``alias`` and ``alias:tag``.

E2B names a template build ``alias:tag`` (``alias`` alone is ``alias:default``), and
``Sandbox.create("alias:tag")`` starts that build. A forkd template is one snapshot
tag, whose rules (``bounds.TAG_RE``) have no ``:``; so ``alias:tag`` is the snapshot
``alias.tag``, and ``alias`` or ``alias:default`` the snapshot ``alias``. For the
mapping to be one-to-one, the alias of a tagged name may not hold a ``.``: ``a.b:c``
would otherwise be ``a:b.c`` as well.

More tags on one build (E2B's ``assign_tags``) are more names of its snapshot
(``Runtime.name_snapshot``): ``alias:prod`` assigned to ``alias:v1`` makes the
name ``alias.prod`` stand for the snapshot ``alias.v1``.
"""

from __future__ import annotations

from forkd.bounds import TAG_RE
from forkd.errors import InvalidRequest

DEFAULT_TAG = "default"  # E2B's tag for a name without one
MAX_TAGS = 32  # tags in one build, assign or remove


def snapshot_tag(name: str) -> str:
    """The forkd snapshot tag of the E2B template name ``name``; ``InvalidRequest`` if it has none."""
    alias, sep, tag = name.partition(":")
    if sep and (not alias or not tag):
        raise InvalidRequest(f"template name {name[:80]!r}: a name is alias or alias:tag, neither part empty")
    if sep and tag != DEFAULT_TAG:
        if "." in alias or ":" in tag:
            raise InvalidRequest(f"template name {name[:80]!r}: with a tag, the alias may not hold '.' "
                                 "and the tag no ':' (alias:tag is the forkd snapshot alias.tag)")
        alias = f"{alias}.{tag}"
    if not TAG_RE.match(alias):
        raise InvalidRequest(f"template name {name[:80]!r} must be a forkd tag (alias:tag as alias.tag): "
                             "letters, digits, '.', '_' and '-', at most 64")
    return alias


def tag_name(alias: str, tag: str) -> tuple[str, str]:
    """The snapshot name of ``tag`` (``t`` or ``alias:t``) on the template ``alias``, and its tag part."""
    given_alias, sep, part = tag.rpartition(":")
    if sep and given_alias != alias:
        raise InvalidRequest(f"tag {tag[:80]!r}: a tag is a tag alone, or {alias}:tag")
    if not part:
        raise InvalidRequest(f"tag {tag[:80]!r} is empty")
    return snapshot_tag(f"{alias}:{part}"), part


def tag_of(name: str) -> str:
    """The tag part of an E2B template name (``default`` without one)."""
    _, sep, tag = name.partition(":")
    return tag if sep else DEFAULT_TAG


__all__ = ["DEFAULT_TAG", "MAX_TAGS", "snapshot_tag", "tag_name", "tag_of"]
