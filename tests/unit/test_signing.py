"""Request signing: the signature covers the method's text whichever channel type hands it over
(grpc.aio gives bytes, the thread-pool channel str), so a service verifying it agrees."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from quarry.signing import ACCESS_KEY_HEADER, NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, SigningInterceptor, sign


@pytest.mark.parametrize("method", ["/quarry.v1.CommitLogService/GetMessages", b"/quarry.v1.CommitLogService/GetMessages"])
def test_the_signature_covers_the_method_text(method: str | bytes) -> None:
    details = SimpleNamespace(method=method, timeout=1.0, metadata=None, credentials=None, wait_for_ready=None, compression=None)
    signed, signature = SigningInterceptor("ak", "sk")._details(details, "digest")  # type: ignore[arg-type]
    md = dict(signed.metadata)
    assert md[ACCESS_KEY_HEADER] == "ak" and md[SIGNATURE_HEADER] == signature
    assert signature == sign("sk", "/quarry.v1.CommitLogService/GetMessages", int(md[TIMESTAMP_HEADER]), "ak", md[NONCE_HEADER], "digest")
    assert signed.method == method  # passed on as the channel gave it
