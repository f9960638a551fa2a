"""``fgpu serve --listen`` (issue 14, point 6): a token file open to group or others is
refused with the ``chmod`` to run; an address beyond loopback needs ``--tls-cert`` and
``--tls-key`` (or ``--tokens-in-clear``); with TLS the TCP listener speaks HTTPS while the
Unix socket stays plain; on TCP only ``/v1/healthz`` answers without the token (the rest is
in ``test_api.py``)."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from fgpu.cli import app
from fgpu.server.main import is_loopback
from tests.integration.test_cli_service import start_server, stop_server
from tests.localusers import ALICE, BOB, ensure_users, uid_of

SECRET = "tcp-token-0123456789abcdef"


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def serve(tmp_path: Path, *args: str) -> tuple[int, str]:
    """``fgpu serve ARGS`` in-process; (exit code, stderr). Only for option refusals."""
    socket = tmp_path / "run" / "fgpu.sock"
    state = ["--state-dir", str(tmp_path / "state")]
    result = CliRunner().invoke(app, ["serve", "--socket", str(socket), *state, *args])
    assert not socket.exists()
    return result.exit_code, result.stderr


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660])
def test_a_token_file_open_to_group_or_others_is_refused_with_the_chmod(
    tmp_path: Path, token: Path, mode: int
) -> None:
    token.chmod(mode)
    code, stderr = serve(
        tmp_path, "--listen", "127.0.0.1:0", "--token-file", str(token), "--token-user", "65534"
    )
    assert code == 2
    assert f"--token-file: {token} is open to group or others (mode {mode:04o})" in stderr
    assert f"run chmod 600 {token}" in stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to another user")
def test_a_token_file_of_another_user_or_a_link_is_refused(tmp_path: Path, token: Path) -> None:
    """Whoever owns the token file could act as the token's user: a root server takes only a
    file of root's (or its own user's), never through a symbolic link."""
    ensure_users()
    os.chown(token, uid_of(BOB), -1)
    code, stderr = serve(
        tmp_path, "--listen", "127.0.0.1:0", "--token-file", str(token), "--token-user", ALICE
    )
    assert code == 2
    assert f"--token-file: {token} belongs to uid {uid_of(BOB)}" in stderr
    os.chown(token, 0, -1)
    link = tmp_path / "link"
    link.symlink_to(token)
    code, stderr = serve(
        tmp_path, "--listen", "127.0.0.1:0", "--token-file", str(link), "--token-user", ALICE
    )
    assert code == 2
    assert f"--token-file: cannot read {link}: it is a symbolic link" in stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]"])
def test_an_address_beyond_loopback_needs_tls_or_the_explicit_flag(
    tmp_path: Path, token: Path, host: str
) -> None:
    code, stderr = serve(
        tmp_path, "--listen", f"{host}:0", "--token-file", str(token), "--token-user", "65534"
    )
    assert code == 2
    assert "is not a loopback address" in stderr
    assert "--tls-cert and --tls-key, or --tokens-in-clear" in stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tls-cert", "/nonexistent"], "--tls-cert and --tls-key go together"),
        (["--tls-cert", "/etc/hostname", "--tls-key", "/etc/hostname"], "cannot load"),
    ],
    ids=["half", "not-pem"],
)
def test_tls_files_are_checked_before_anything_starts(
    tmp_path: Path, token: Path, args: list[str], message: str
) -> None:
    listen = ["--listen", "0.0.0.0:0", "--token-file", str(token), "--token-user", "65534"]
    code, stderr = serve(tmp_path, *listen, *args)
    assert code == 2
    assert message in stderr


@pytest.mark.parametrize(
    "args",
    [["--tls-cert", "c", "--tls-key", "k"], ["--tokens-in-clear"]],
    ids=["tls", "clear"],
)
def test_tcp_options_without_listen_are_refused(tmp_path: Path, args: list[str]) -> None:
    code, stderr = serve(tmp_path, *args)
    assert code == 2
    assert "only used with --listen" in stderr


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("no-such-host.invalid", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    key.chmod(0o600)
    return cert, key


def test_with_tls_the_tcp_listener_speaks_https_and_the_socket_stays_plain(
    tmp_path: Path, token: Path, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    server = start_server(
        tmp_path / "srv",
        "--listen",
        "0.0.0.0:0",
        "--token-file",
        str(token),
        "--token-user",
        "65534",
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
    )
    try:
        log = (tmp_path / "srv" / "serve.log").read_text()
        port = int(log.split("https://0.0.0.0:")[1].split(" ")[0])
        trust = ssl.create_default_context(cafile=str(cert))
        base = f"https://127.0.0.1:{port}"
        bearer = {"authorization": f"Bearer {SECRET}"}
        with httpx.Client(base_url=base, verify=trust) as https:
            assert https.get("/v1/healthz").status_code == 200
            assert https.get("/v1/nodes").status_code == 401
            assert https.get("/openapi.json").status_code == 401
            nodes = https.get("/v1/nodes", headers=bearer)
            assert nodes.status_code == 200
            assert nodes.json()[0]["gpus"][0]["model"] == "A100-40GB"
        with pytest.raises(httpx.HTTPError):  # no plain HTTP on the TLS port
            httpx.get(f"http://127.0.0.1:{port}/v1/healthz", timeout=5)
        with server.client() as client:  # the Unix socket: plain, identity from the peer
            assert client.health().caller_uid is not None
    finally:
        assert stop_server(server) == 0
