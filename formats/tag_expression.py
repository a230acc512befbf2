"""RocketMQ's tag subscription expression (`TagA || TagB`, `*`), as FilterAPI parses it.

A queue unit matches when its tagsCode is the Java hashCode of one of the tags (the broker's
check on the ConsumeQueue); a record matches only when its real TAGS is one of them (the
client's check after the pull): different tags can share a hash, so the code only narrows.
"""
from __future__ import annotations

from dataclasses import dataclass

from quarry.formats.java_hash import java_string_hash

SUB_ALL = "*"
MAX_EXPRESSION_CHARS = 4096


class TagExpressionError(ValueError):
    """An expression that cannot be used; the message names the rule."""


@dataclass(frozen=True)
class TagFilter:
    """Parsed expression: `tags` empty means every message (the `*` subscription)."""

    tags: frozenset[str]
    codes: frozenset[int]

    @property
    def all(self) -> bool:
        return not self.tags

    def matches_code(self, tags_code: int) -> bool:
        """The ConsumeQueue check: may this unit's message carry one of the tags?"""
        return self.all or tags_code in self.codes

    def matches_tag(self, tag: str | None) -> bool:
        """The exact check on the record's TAGS property."""
        return self.all or (tag is not None and tag in self.tags)


MATCH_ALL = TagFilter(frozenset(), frozenset())


def parse(expression: str | None, field: str = "tag_expression") -> TagFilter:
    """`""`, `None` or `*` match everything; otherwise tags split on `||`, trimmed, empties dropped."""
    text = (expression or "").strip()
    if not text or text == SUB_ALL:
        return MATCH_ALL
    if len(text) > MAX_EXPRESSION_CHARS:
        raise TagExpressionError(f"{field}: at most {MAX_EXPRESSION_CHARS} characters")
    tags = [t.strip() for t in text.split("||")]
    tags = [t for t in tags if t]
    if not tags:
        raise TagExpressionError(f"{field}: {expression!r} names no tag (expected TagA or TagA || TagB, or *)")
    for t in tags:
        if t == SUB_ALL:
            raise TagExpressionError(f"{field}: '*' cannot be combined with tags")
    return TagFilter(frozenset(tags), frozenset(java_string_hash(t) for t in tags))
