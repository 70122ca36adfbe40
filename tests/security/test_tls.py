"""TLS on both transports, with a certificate the test generates for 127.0.0.1."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from service.client import MirrorClient
from service.contract import MirrorRequest
from service.server.app import Service
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A key and a certificate valid for 127.0.0.1 and localhost, for one test."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "understudy-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path, cert_path = directory / "key.pem", directory / "cert.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


def test_tls_on_grpc_and_http(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    tmp_path: Path,
) -> None:
    key, cert = self_signed(tmp_path)
    service = make_service(tls_cert_file=cert, tls_key_file=key, scoring_enabled=False)

    client = MirrorClient(
        f"127.0.0.1:{service.grpc_port}", runtime_token, root_certificates=cert.read_bytes()
    )
    assert client.mirror(mirror_request_to_pb(requests_sample[0]))
    assert client.flush(20)
    assert client.close().mirrors.accepted == 1

    context = ssl.create_default_context(cafile=str(cert))
    response = httpx.post(
        f"https://127.0.0.1:{service.http_port}/v1/mirror",
        content=mirror_to_json(requests_sample[1]),
        headers={"authorization": f"Bearer {runtime_token}"},
        verify=context,
    )
    assert response.status_code == 202 and response.json()["status"] == "accepted"

    with pytest.raises(httpx.HTTPError):  # plaintext is not served
        httpx.get(f"http://127.0.0.1:{service.http_port}/healthz", timeout=2)
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        call = channel.unary_unary("/understudy.v1.ShadowEvaluation/Mirror")
        with pytest.raises(grpc.RpcError) as err:
            call(b"", timeout=2)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert service.journal.head_seq == 2
