"""A throwaway CA with server and client certificates, made at run time for TLS tests."""
from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _cert(subject: str, issuer_key: ec.EllipticCurvePrivateKey | None, issuer: x509.Name | None, ca: bool, ips: list[str] = ()) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = dt.datetime.now(dt.timezone.utc)
    builder = (
        x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ips:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("quarry.test")] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]), critical=False)
    return key, builder.sign(issuer_key or key, hashes.SHA256())


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[str, str]:
    path.mkdir(parents=True, exist_ok=True)
    (path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path / "cert.pem"), str(path / "key.pem")


def make_pki(directory: Path, ips: list[str]) -> dict[str, str]:
    """CA, a server certificate for `ips` (and quarry.test), a client certificate: file paths."""
    ca_key, ca = _cert("quarry test CA", None, None, ca=True)
    skey, scert = _cert("quarry server", ca_key, ca.subject, ca=False, ips=ips)
    ckey, ccert = _cert("quarry client", ca_key, ca.subject, ca=False)
    directory.mkdir(parents=True, exist_ok=True)
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_cert, server_key = _write(directory / "server", skey, scert)
    client_cert, client_key = _write(directory / "client", ckey, ccert)
    return {"ca": str(ca_path), "server_cert": server_cert, "server_key": server_key, "client_cert": client_cert, "client_key": client_key}
