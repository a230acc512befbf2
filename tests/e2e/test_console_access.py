"""quarry-console with access control on, in a real browser (Debian's Chromium, Playwright's own
driver, as tests/e2e/test_console_browser.py): a router and a broker serving TLS with ACL
accounts, the console talking TLS to the router and serving HTTPS with its own certificate
(Chromium trusts exactly that certificate's key), holding no account of its own.

Before logging in, the router's refusal is shown as a refusal; an operator logs in and sees
what the account may read, and a topic it may not read is refused in the router's words (not
an empty page); a wrong secret is refused; logout ends the session; the session cookie is
HttpOnly, SameSite=Strict and Secure; the secrets are in no URL and no console log line."""
from __future__ import annotations

import base64
import hashlib
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from quarry.clients.admin import AdminClient
from quarry.clients.producer import Producer
from scripts.console_process import ConsoleProcess
from scripts.launcher import LocalCluster
from tests.e2e.pki import make_pki
from tests.e2e.test_console_browser import SHOTS, _tools, drive

ROUTER_HOST, BROKER_HOST, CONSOLE_HOST = "127.0.0.81", "127.0.0.82", "127.0.0.83"
ADMIN = {"access_key": "quarry-admin", "secret_key": "admin-secret-0001", "admin": True}
OPS = {"access_key": "ops", "secret_key": "ops-secret-0002", "topics": {"*": ["query"]}}
READER = {"access_key": "reader", "secret_key": "reader-secret-0003", "topics": {"OrdersA": ["query"]}}
PER_TOPIC = 20


@dataclass
class World:
    console: ConsoleProcess
    chromium_args: list[str]


def _spki_pin(cert_path: str) -> str:
    """base64 SHA-256 of the certificate's public key: Chromium trusts this key only."""
    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    _tools()
    SHOTS.mkdir(parents=True, exist_ok=True)
    root = tmp_path_factory.mktemp("console-access")
    pki = make_pki(root / "pki", [ROUTER_HOST, BROKER_HOST, CONSOLE_HOST])
    (root / "acl.json").write_text(json.dumps({"accounts": [ADMIN, OPS, READER]}))
    env = {"QUARRY_TLS_CERT": pki["server_cert"], "QUARRY_TLS_KEY": pki["server_key"], "QUARRY_TLS_CA": pki["ca"],
           "QUARRY_ACL_FILE": str(root / "acl.json"), "QUARRY_ACCESS_KEY": ADMIN["access_key"], "QUARRY_SECRET_KEY": ADMIN["secret_key"]}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():  # this process too: the launcher's health checks and the sends
            mp.setenv(k, v)
        cluster = LocalCluster(root=root / "cluster", env=env)
        try:
            cluster.start_router(host=ROUTER_HOST)
            cluster.add_broker("broker-a", BROKER_HOST)
            assert cluster.router is not None
            router = cluster.router.address
            with Producer(router) as producer:
                for topic in ("OrdersA", "OrdersB"):
                    producer.send_batch(topic, [f"{topic}-{n}".encode() for n in range(PER_TOPIC)], tags="TagA")
            with AdminClient(router) as admin:
                assert len(admin.browse_topic("OrdersA", max_num=100).messages) == PER_TOPIC
            for k in ("QUARRY_ACCESS_KEY", "QUARRY_SECRET_KEY", "QUARRY_TLS_CERT", "QUARRY_TLS_KEY", "QUARRY_ACL_FILE"):
                mp.delenv(k)  # the console holds no account: only what operators log in with
            console = ConsoleProcess(router, root / "logs" / "console.log", host=CONSOLE_HOST, ca=pki["ca"],
                                     args=["--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"], "--log-level", "DEBUG"],
                                     env={"QUARRY_TLS_CA": pki["ca"]}).start()
            try:
                yield World(console, [f"--ignore-certificate-errors-spki-list={_spki_pin(pki['server_cert'])}"])
            finally:
                console.stop()
        finally:
            cluster.stop()


def _drive(w: World, *steps: dict[str, object]) -> list[dict[str, object]]:
    return drive(w.console, *steps, chromium_args=w.chromium_args)


def test_before_logging_in_the_routers_refusal_is_shown_as_a_refusal(world: World) -> None:
    (page,) = _drive(world, {"do": "view", "path": "/browse?topic=OrdersA&order=oldest", "wait": "#error-banner", "table": "browse-table",
                             "shot": "refused-not-signed-in"})
    assert page["url"].startswith("https://")
    (b,) = page["banners"]
    assert b["kind"] == "refused" and "unknown or missing access key" in b["text"] and "Log in" in b["text"], page["banners"]
    assert page["rows"] == []


def test_an_operator_logs_in_sees_what_the_account_may_read_and_a_refusal_in_the_routers_words(world: World) -> None:
    login, refused, logout, after = _drive(
        world,
        {"do": "login", "accessKey": READER["access_key"], "secretKey": READER["secret_key"], "next": "/browse?topic=OrdersA&order=oldest",
         "wait": "#browse-summary", "table": "browse-table", "shot": "login-browse"},
        {"do": "view", "path": "/browse?topic=OrdersB&order=oldest", "wait": "#error-banner", "table": "browse-table", "shot": "refused"},
        {"do": "logout"},
        {"do": "view", "path": "/browse?topic=OrdersA&order=oldest", "wait": "#error-banner", "table": "browse-table"},
    )
    assert "Signed in as reader" in login["account"]
    assert [r["broker"] for r in login["rows"]] == ["broker-a"] * PER_TOPIC
    (cookie,) = login["cookies"]
    assert cookie["name"] == "quarry_console_session" and cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["secure"]
    assert login["scriptCookie"] == ""  # HttpOnly: the page's scripts cannot read it
    (b,) = [x for x in refused["banners"] if x["kind"] != "note"]
    assert b["kind"] == "refused" and "access key reader lacks query permission on OrdersB" in b["text"], refused["banners"]
    assert refused["rows"] == []
    assert "Log in" in logout["account"] and logout["cookies"] == []
    assert [x["kind"] for x in after["banners"]] == ["refused"] and "unknown or missing access key" in after["banners"][0]["text"]
    urls = json.dumps([login["url"], refused["url"], logout["url"], after["url"]])
    assert READER["secret_key"] not in urls
    assert READER["secret_key"] not in world.console.log_path.read_text()  # at DEBUG, every request logged


def test_an_account_that_may_read_every_topic_lists_them(world: World) -> None:
    login, cluster = _drive(
        world,
        {"do": "login", "accessKey": OPS["access_key"], "secretKey": OPS["secret_key"], "next": "/browse?topic=OrdersB&order=oldest",
         "wait": "#browse-summary", "table": "browse-table"},
        {"do": "view", "path": "/cluster", "wait": "#brokers, #error-banner"},
    )
    assert len(login["rows"]) == PER_TOPIC and not [b for b in login["banners"] if b["kind"] in ("refused", "error")]
    # the broker list is the routers' (query on *); a store status the account may not read
    # (admin permission) is named with the broker's words, never passed off as empty
    assert not [b for b in cluster["banners"] if b["kind"] in ("refused", "error")], cluster["banners"]
    assert all("lacks admin permission" in b["text"] for b in cluster["banners"] if b["kind"] == "incomplete")


def test_a_wrong_secret_is_refused_in_the_routers_words(world: World) -> None:
    (page,) = _drive(world, {"do": "login", "accessKey": READER["access_key"], "secretKey": "not-the-secret", "fails": True, "shot": "login-refused"})
    assert page["url"].split("?")[0].endswith("/login") and page["cookies"] == []
    (b,) = page["banners"]
    assert b["kind"] == "refused" and "bad signature" in b["text"], page["banners"]
    assert "not-the-secret" not in world.console.log_path.read_text()


def test_the_console_serves_only_https_with_its_certificate(world: World) -> None:
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(world.console.url + "/healthz", timeout=10, context=ssl.create_default_context())
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(world.console.url.replace("https://", "http://") + "/healthz", timeout=10)
