"""What the quic transport tells aioquic: the job's certificate, and how large a datagram.

One certificate per job, which every rank derives alike from the job's secret, so none
travels and a client pins the one its server must present. A server without the secret
cannot present it (the handshake fails with "self-signed certificate" or a bad signature),
so the data goes to no one else. Ed25519 signs deterministically: the same key and fields
give the same bytes on every rank. The client is not proven by TLS (aioquic's client
certificates are for tests); it proves the job's secret in-band, first thing on its stream
(rxelab.transports.quic_admission).

A datagram carries one packet, and aioquic's cost is per packet: the largest the path and
aioquic's packet protection allow.
"""

from __future__ import annotations

import datetime
import socket
import ssl
from collections.abc import Iterable
from typing import Any

from aioquic._crypto import AEAD, CryptoError
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from rxelab.control.handshake import Credential
from rxelab.errors import ConfigError

ALPN = "rxelab-data"
DATAGRAM = 1452  # UDP payload where the path's MTU is unknown: fits 1500 over IPv6 as over IPv4
DATAGRAM_SIZES = (16384, 8952, 4096, 1452)  # tried largest first (loopback's MTU is 64 KiB)
IP_MTU, IPV6_MTU = 14, 24  # Linux's getsockopt names for a connected socket's path MTU
UDP_SEGMENT = 103  # Linux's UDP GSO (4.18+): one send the kernel cuts into datagrams
GSO = hasattr(socket, "SOL_UDP")
# QUIC's flow control window, a stream's and a connection's: aioquic's 1 MiB made a sender of
# a 1 MiB block wait a round trip for more, every call. The receiver's memory is bounded by
# the wire's credits and the engine's window instead (a write lands in place).
FLOW_BYTES = 64 << 20
GSO_BYTES = 65000  # at most this much in one such send (a UDP datagram's limit, less headers)
GSO_SEGMENTS = 64  # the kernel's UDP_MAX_SEGMENTS
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
        config.max_data, config.max_stream_data = FLOW_BYTES, FLOW_BYTES
    return client, server


def sealable() -> int:
    """The largest datagram aioquic's packet protection takes: 1.2 (Debian 13's) seals at most
    1500 bytes a packet, 1.7 far more. Asked of it, not of its version."""
    aead = AEAD(b"aes-128-gcm", bytes(16), bytes(12))
    for size in DATAGRAM_SIZES:
        try:
            aead.encrypt(bytes(size), bytes(20), 0)
            return size
        except CryptoError:  # too long for it
            continue
    return DATAGRAM


SEALABLE = sealable()


def datagram_size(address: tuple[str, int], family: int) -> int:
    """The largest UDP payload the path to `address` carries whole and aioquic seals: a
    9000-byte MTU means a sixth of the packets (and of aioquic's work per byte) of 1500."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)  # a route lookup: nothing is sent
            if family == socket.AF_INET6:
                path = probe.getsockopt(socket.IPPROTO_IPV6, IPV6_MTU) - 48
            else:
                path = probe.getsockopt(socket.IPPROTO_IP, IP_MTU) - 28
    except OSError:
        path = DATAGRAM
    return max(1200, min(SEALABLE, path))


def queued(quic: QuicConnection, stream: int) -> int:
    """Bytes aioquic holds for the stream until its peer acknowledged them (it keeps no
    public count; 0 where its insides differ)."""
    found = getattr(quic, "_streams", {}).get(stream)
    return len(getattr(getattr(found, "sender", None), "_buffer", b""))


def batches(datagrams: Iterable[tuple[bytes, Any]], gso: bool
            ) -> list[tuple[list[bytes], int, Any]]:
    """Datagrams grouped for UDP GSO: runs to one address of one size (the last may be shorter),
    each (datagrams, their size, address); one a batch without gso. A packet a send instead of
    a packet a syscall: aioquic's datagrams are all of the path's size while a stream flows."""
    out: list[tuple[list[bytes], int, Any]] = []
    for data, address in datagrams:
        if gso and out:
            batch, size, to = out[-1]
            if (to == address and len(batch[-1]) == size and len(data) <= size
                    and len(batch) < GSO_SEGMENTS and (len(batch) + 1) * size <= GSO_BYTES):
                batch.append(data)
                continue
        out.append(([data], len(data), address))
    return out
