"""A throw-away certificate authority (``openssl`` CLI) and a TLS-only Redis server."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.redis_server import RedisServer


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path) -> Certificates:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    if shutil.which("openssl") is None:
        import pytest

        pytest.skip("the openssl command is needed to make a throw-away CA")
    directory.mkdir(parents=True, exist_ok=True)
    # the extensions Python 3.13's strict verification (VERIFY_X509_STRICT) requires: a CA
    # with a key usage, leaves naming their issuer's key
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=leaderbeat test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=directory)
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                       "basicConstraints=CA:FALSE\n"
                                       "authorityKeyIdentifier=keyid,issuer\n"
                                       "subjectKeyIdentifier=hash\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=leaderbeat {name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=directory)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", "san.ext",
                 "-out", f"{name}.crt", cwd=directory)
    return Certificates(directory / "ca.crt", directory / "server.crt", directory / "server.key",
                        directory / "client.crt", directory / "client.key")


def tls_server(certs: Certificates, workdir: Path) -> RedisServer:
    """A Redis that speaks only TLS and requires a client certificate signed by the CA."""
    return RedisServer(["--port", "0", "--tls-cert-file", str(certs.server_cert),
                        "--tls-key-file", str(certs.server_key),
                        "--tls-ca-cert-file", str(certs.ca), "--tls-auth-clients", "yes"],
                       port_flag="--tls-port", workdir=workdir)
