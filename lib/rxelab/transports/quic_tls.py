"""The quic transport's TLS: one certificate per job, which every rank derives alike from the
job's secret, so none travels and a client pins the one its server must present. A server
without the secret cannot present it (the handshake fails with "self-signed certificate"
or a bad signature), so the data goes to no one else. Ed25519 signs deterministically: the
same key and fields give the same bytes on every rank.

The client is not proven by TLS (aioquic's client certificates are for tests); it proves the
job's secret in-band, first thing on its stream (rxelab.transports.quic).
"""

from __future__ import annotations

import datetime
import ssl

from aioquic.quic.configuration import QuicConfiguration
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from rxelab.control.handshake import Credential
from rxelab.errors import ConfigError

ALPN = "rxelab-data"
NOT_BEFORE = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)  # no clock skew can matter
NOT_AFTER = datetime.datetime(9999, 1, 1, tzinfo=datetime.UTC)


def server_name(scope: str) -> str:
    """The name the certificate is for: the job's, under a domain that resolves nowhere."""
    label = "".join(c if c.isalnum() else "-" for c in scope.lower())[:60].strip("-") or "job"
    return f"{label}.rxelab.invalid"


def certificate(credential: Credential, scope: str) -> tuple[x509.Certificate, Ed25519PrivateKey]:
    """(certificate, private key) of the job: what each rank derives alike."""
    seed = credential.derive(b"quic certificate\0" + scope.encode())
    if seed is None:
        raise ConfigError(f"transport quic needs a job secret to derive its certificate from; "
                          f"{credential.source} shares none",
                          hint="give the job a secret (RXELAB_SECRET or secret_file=), or use "
                               "transport tcp")
    key = Ed25519PrivateKey.from_private_bytes(seed)
    name = server_name(scope)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(int.from_bytes(seed[:16], "big") >> 1 or 1)
            .not_valid_before(NOT_BEFORE).not_valid_after(NOT_AFTER)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, None))
    return cert, key


def configurations(credential: Credential, scope: str, *, congestion: str, idle_s: float,
                   datagram: int) -> tuple[QuicConfiguration, QuicConfiguration]:
    """(client's, server's) QuicConfiguration for the job: the server presents the job's
    certificate, the client accepts that one alone."""
    cert, key = certificate(credential, scope)
    client = QuicConfiguration(is_client=True, verify_mode=ssl.CERT_REQUIRED,
                               server_name=server_name(scope),
                               cadata=cert.public_bytes(Encoding.PEM))
    server = QuicConfiguration(is_client=False, certificate=cert, private_key=key)
    for config in (client, server):
        config.alpn_protocols = [ALPN]
        config.congestion_control_algorithm = congestion
        config.idle_timeout = idle_s
        config.max_datagram_size = datagram
    return client, server
