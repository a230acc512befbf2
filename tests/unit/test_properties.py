"""formats.properties.stored_properties against a plain reading of its rules: the stored text
is KEYS (space-joined), TAGS, UNIQ_KEY, then the user's pairs, name\\x01value joined by \\x02;
a key that is empty or holds a space, a reserved or empty property name, and a \\x01 or \\x02
anywhere are refused with the field named, in that order."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quarry.formats.properties import PropertyError, stored_properties

_chars = st.characters(blacklist_categories=("Cs",))
_text = st.one_of(st.text(alphabet=st.sampled_from("ab \x01\x02é"), max_size=4), st.text(alphabet=_chars, max_size=6))
_clean = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=8)


def _reference(keys: list[str], tags: str, unique_key: str, props: list[tuple[str, str]]) -> tuple[bytes, str | None] | str:
    """The stored bytes and KEYS value, or the field an error names."""
    for i, k in enumerate(keys):
        if not k:
            return f"keys[{i}]"
        if " " in k:
            return f"keys[{i}]"
    for i, (name, _) in enumerate(props):
        if name in ("KEYS", "TAGS", "UNIQ_KEY") or not name:
            return f"properties[{i}].name"
    fields = [(f"keys[{i}]", k) for i, k in enumerate(keys)] + [("tags", tags), ("unique_key", unique_key)]
    for name, value in fields:
        if "\x01" in value or "\x02" in value:
            return name
    for i, (name, value) in enumerate(props):
        for what, text in (("name", name), ("value", value)):
            if "\x01" in text or "\x02" in text:
                return f"properties[{i}].{what}"
    pairs = ([("KEYS", " ".join(keys))] if keys else []) + ([("TAGS", tags)] if tags else []) + ([("UNIQ_KEY", unique_key)] if unique_key else []) + props
    encoded = "\x02".join(f"{n}\x01{v}" for n, v in pairs).encode()
    if len(encoded) > 32767:
        return "properties"
    return encoded, (" ".join(keys) if keys else None)


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.one_of(_text, _clean), max_size=3), st.one_of(st.just(""), _text, _clean), st.one_of(st.just(""), _text, _clean),
       st.lists(st.tuples(st.one_of(_text, _clean, st.sampled_from(["TAGS", "a"])), st.one_of(_text, _clean)), max_size=3))
def test_stored_properties_follow_the_rules(keys: list[str], tags: str, unique_key: str, props: list[tuple[str, str]]) -> None:
    want = _reference(keys, tags, unique_key, props)
    if isinstance(want, str):
        with pytest.raises(PropertyError) as err:
            stored_properties(keys, tags, unique_key, props, "messages[2].")
        assert str(err.value).startswith(f"messages[2].{want}:"), (str(err.value), want)
    else:
        assert stored_properties(keys, tags, unique_key, props) == want


def test_a_separator_is_named_before_a_lone_surrogate_fails_to_encode() -> None:
    with pytest.raises(PropertyError, match=r"^tags: must not contain"):
        stored_properties(["k"], "a\x01", "\ud800", [])
    with pytest.raises(UnicodeEncodeError):
        stored_properties(["k"], "a", "\ud800", [])
