"""Keys generated to collide: `topic#key` names with the same Java String.hashCode as another
name, so tests show the index answering by hash without hand-picked keys."""
from __future__ import annotations

from quarry.formats.java_hash import java_string_hash

_LEN = 7  # 31**7 > 2**32: any hash is reachable with seven base-31 digits
_BASE = ord("A")  # digits map to 'A'..'_': printable, no space (a KEYS token)


def colliding_key(topic: str, target_name: str) -> str:
    """A key whose index name `topic#key` hashes as `target_name` (e.g. "TopicSecret#k")."""
    prefix = f"{topic}#"
    weight = sum(31**i for i in range(_LEN))
    # hash(prefix + key) = hash(prefix) * 31**7 + sum(c_i * 31**(6 - i)), all mod 2**32.
    need = (java_string_hash(target_name) - java_string_hash(prefix) * 31**_LEN - _BASE * weight) % 2**32
    digits = []
    for _ in range(_LEN):
        need, d = divmod(need, 31)
        digits.append(d)
    key = "".join(chr(_BASE + d) for d in reversed(digits))
    assert java_string_hash(prefix + key) == java_string_hash(target_name) and prefix + key != target_name
    return key
