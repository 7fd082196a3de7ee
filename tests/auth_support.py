"""Real parts for the outbound authentication tests: an OAuth 2.0 token endpoint on loopback that issues
signed, expiring tokens (JWTs, HS256) and counts what it is asked; throwaway TLS material made with the
``openssl`` command (a CA, a server certificate for 127.0.0.1, client certificates it issued); and a
loopback HTTPS receiver that can demand a client certificate."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ssl
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

import orjson
from aiohttp import web

from oste.domain.clock import ManualClock
from tests.engine_support import Receiver

CLIENT_ID = "oste-client"
CLIENT_SECRET = "s3cr3t:with/odd+chars"


@dataclass(frozen=True)
class Pem:
    certificate: str
    private_key: str
    cert_path: Path
    key_path: Path


@dataclass(frozen=True)
class TestPki:
    """A CA and what it issued (and a stranger: a self-signed client no CA vouches for)."""

    ca: Pem
    server: Pem
    client: Pem
    other_client: Pem
    stranger: Pem
    encrypted_key: str


TestPki.__test__ = False  # type: ignore[attr-defined]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _key(name: str, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name, cwd=cwd)


def _issued(name: str, subject: str, cwd: Path, extensions: str) -> Pem:
    _key(f"{name}.key", cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl(
        *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"),
        *("-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt"),
        cwd=cwd,
    )
    return _pem(name, cwd)


def _pem(name: str, cwd: Path) -> Pem:
    cert, key = cwd / f"{name}.crt", cwd / f"{name}.key"
    return Pem(cert.read_text(), key.read_text(), cert, key)


def make_pki(directory: Path) -> TestPki:
    """Make the CA, a server certificate for 127.0.0.1, two clients and a self-signed stranger."""
    directory.mkdir(parents=True, exist_ok=True)
    _key("ca.key", directory)
    _openssl(
        *("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=OSTE test CA", "-days", "2"),
        *("-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"),
        *("-out", "ca.crt"),
        cwd=directory,
    )
    ca = _pem("ca", directory)
    server = _issued(
        "server", "/CN=127.0.0.1", directory, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    )
    client = _issued("client", "/CN=oste-client", directory, "extendedKeyUsage=clientAuth\n")
    other = _issued("other", "/CN=other-client", directory, "extendedKeyUsage=clientAuth\n")
    _key("stranger.key", directory)
    _openssl(
        *("req", "-x509", "-new", "-key", "stranger.key", "-subj", "/CN=stranger", "-days", "2"),
        *("-out", "stranger.crt"),
        cwd=directory,
    )
    _openssl(
        *("pkey", "-in", "client.key", "-aes256", "-passout", "pass:secret", "-out", "encrypted.key"),
        cwd=directory,
    )
    return TestPki(
        ca, server, client, other, _pem("stranger", directory), (directory / "encrypted.key").read_text()
    )


@dataclass
class TlsReceiver(Receiver):
    """A ``Receiver`` over HTTPS with the test CA's server certificate; with ``client_ca`` it demands a
    client certificate that CA issued (mutual TLS) and records its subject in ``peers``."""

    pki: TestPki | None = None
    require_client: bool = True
    peers: list[str | None] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def start(self) -> TlsReceiver:
        assert self.pki is not None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.pki.server.cert_path, self.pki.server.key_path)
        if self.require_client:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=str(self.pki.ca.cert_path))
        self.peers = []
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle_tls)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._changed = asyncio.Condition()
        return self

    async def _handle_tls(self, request: web.Request) -> web.StreamResponse:
        transport = request.transport
        peer = transport.get_extra_info("peercert") if transport is not None else None
        subject = dict(item[0] for item in peer["subject"]).get("commonName") if peer else None
        assert self.peers is not None
        self.peers.append(subject)
        return await self._handle(request)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class TokenServer:
    """An OAuth 2.0 token endpoint (client credentials) on 127.0.0.1: checks HTTP Basic client
    authentication and the form, issues HS256 JWTs with an ``exp`` (on its own ``clock``) and counts
    requests. ``mode``: ``ok``, or an HTTP status to answer instead (with an OAuth error body)."""

    clock: ManualClock
    expires_in: int | None = 3600
    mode: int | str = "ok"
    delay: float = 0.0
    key: bytes = field(default_factory=lambda: uuid.uuid4().bytes)
    requests: list[dict[str, Any]] = field(default_factory=list)
    issued: list[str] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/oauth/token"

    async def start(self) -> TokenServer:
        app = web.Application()
        app.router.add_post("/oauth/token", self._token)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        self.requests.append({"headers": dict(request.headers), "form": form})
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.mode != "ok":
            body = {"error": "invalid_client", "error_description": f"no such client (not {CLIENT_SECRET})"}
            return web.json_response(body, status=int(self.mode))
        scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
        user, _, password = base64.b64decode(encoded).decode().partition(":")
        if scheme != "Basic" or (unquote_plus(user), unquote_plus(password)) != (CLIENT_ID, CLIENT_SECRET):
            return web.json_response({"error": "invalid_client"}, status=401)
        if form.get("grant_type") != "client_credentials":
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        now = int(self.clock.now().timestamp())
        claims = {"sub": CLIENT_ID, "iat": now, "jti": uuid.uuid4().hex, "aud": form.get("audience")}
        if self.expires_in is not None:
            claims["exp"] = now + self.expires_in
        head = _b64(orjson.dumps({"alg": "HS256", "typ": "JWT"}))
        body = f"{head}.{_b64(orjson.dumps(claims))}"
        token = f"{body}.{_b64(hmac.new(self.key, body.encode(), hashlib.sha256).digest())}"
        self.issued.append(token)
        answer: dict[str, Any] = {"access_token": token, "token_type": "Bearer"}
        if self.expires_in is not None:
            answer["expires_in"] = self.expires_in
        return web.json_response(answer)

    def valid(self, authorization: str | None, revoked: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
        """True for ``Bearer <a token this server signed, not expired on its clock, not revoked>``."""
        if not authorization or not authorization.startswith("Bearer "):
            return False
        token = authorization.removeprefix("Bearer ")
        body, _, signature = token.rpartition(".")
        expected = _b64(hmac.new(self.key, body.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(signature, expected) or token in revoked:
            return False
        claims = orjson.loads(base64.urlsafe_b64decode(body.split(".")[1] + "=="))
        return "exp" not in claims or claims["exp"] > self.clock.now().timestamp()


def checking(tokens: TokenServer, revoked: set[str] | None = None) -> Any:
    """A receiver behaviour: 200 for a valid token, 401 otherwise (echoing what it got)."""

    async def behaviour(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        sent = request.headers.get("Authorization")
        if tokens.valid(sent, revoked or set()):
            return web.Response(text=f"welcome, you sent {sent}")
        return web.Response(status=401, text=f"refused: {sent}")

    return behaviour
