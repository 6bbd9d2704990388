"""The tenants file (``--auth-tokens FILE``): who may call, with which weight, roles and quotas.

JSON (or TOML when the name ends in ``.toml``)::

    {
      "open_services": ["grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"],
      "open_http_paths": ["/health", "/metrics"],
      "tenants": {
        "team-a": {
          "token_sha256": ["<hex sha256 of a token>", "..."],
          "identities": ["spiffe://example.org/team-a", "team-a-client"],
          "roles": ["user"],
          "weight": 1.0,
          "max_concurrent": 32, "max_queued": 64, "tokens_per_minute": 200000
        }
      }
    }

Only SHA-256 digests of tokens are stored, never tokens. ``identities`` are
client-certificate identities (a SAN URI or the subject CN) that authenticate
as the tenant without a token when mTLS is on. ``roles``: ``user`` may generate,
``admin`` may also read GetMetrics (and ``/metrics`` of the HTTP API when it
is not in ``open_http_paths``, which by default holds ``/health`` and
``/metrics``: Prometheus and the inference gateway scrape without a token).
Quotas of 0 mean unlimited.

A file is refused (``TenantFileError``, one line naming the problem) when a
tenant name appears twice, or when one token digest or one identity is listed
under two tenants: either would silently take a tenant's credentials away.

``TenantFile`` re-reads the file when its mtime changes (checked at most every
``check_interval_s``) or when ``reload()`` is called (SIGHUP). A file that fails
to parse is logged and ignored: the previous tenants stay in force.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.request.strict_json import DuplicateKeyError, unique_keys

log = logging.getLogger("service.auth")

ANONYMOUS = "anonymous"
DEFAULT_OPEN_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)
DEFAULT_OPEN_HTTP_PATHS = ("/health", "/metrics")
ROLES = ("user", "admin")


class TenantFileError(ValueError):
    """The tenants file is malformed (the message names the problem)."""


@dataclass(frozen=True)
class Tenant:
    name: str
    token_sha256: tuple[bytes, ...] = ()
    identities: tuple[str, ...] = ()
    roles: frozenset[str] = frozenset({"user"})
    weight: float = 1.0
    max_concurrent: int = 0
    max_queued: int = 0
    tokens_per_minute: int = 0


@dataclass(frozen=True)
class TenantTable:
    tenants: dict[str, Tenant] = field(default_factory=dict)
    open_services: frozenset[str] = frozenset(DEFAULT_OPEN_SERVICES)
    open_http_paths: frozenset[str] = frozenset(DEFAULT_OPEN_HTTP_PATHS)

    def by_token(self, token: str) -> Tenant | None:
        """The tenant owning ``token``; every digest is compared in constant time (no early exit)."""
        return self.by_digest(token_digest(token))

    def by_digest(self, digest: bytes) -> Tenant | None:
        """The tenant owning a token of this SHA-256 ``digest`` (constant-time compares, no early exit)."""
        found: Tenant | None = None
        for tenant in self.tenants.values():
            for known in tenant.token_sha256:
                if hmac.compare_digest(digest, known) and found is None:
                    found = tenant
        return found

    def by_identity(self, identities: list[str]) -> Tenant | None:
        """The tenant naming one of a client certificate's ``identities`` (SAN URIs, CN)."""
        for tenant in self.tenants.values():
            if any(i in tenant.identities for i in identities):
                return tenant
        return None


def token_digest(token: str) -> bytes:
    """SHA-256 of a bearer token: what the tenants file lists."""
    return hashlib.sha256(token.encode()).digest()


def _digests(raw: Any, name: str) -> tuple[bytes, ...]:
    items = [raw] if isinstance(raw, str) else list(raw or [])
    out = []
    for item in items:
        try:
            digest = bytes.fromhex(str(item))
        except ValueError:
            digest = b""
        if len(digest) != 32:
            raise TenantFileError(f"tenant {name!r}: token_sha256 entries must be 64 hex digits")
        out.append(digest)
    return tuple(out)


def _tenant(name: str, raw: dict[str, Any]) -> Tenant:
    roles = frozenset(raw.get("roles", ["user"]))
    if not roles <= set(ROLES):
        raise TenantFileError(f"tenant {name!r}: unknown role(s) {sorted(roles - set(ROLES))}")
    try:
        tenant = Tenant(
            name=name,
            token_sha256=_digests(raw.get("token_sha256"), name),
            identities=tuple(str(i) for i in raw.get("identities", [])),
            roles=roles,
            weight=float(raw.get("weight", 1.0)),
            max_concurrent=int(raw.get("max_concurrent", 0)),
            max_queued=int(raw.get("max_queued", 0)),
            tokens_per_minute=int(raw.get("tokens_per_minute", 0)),
        )
    except (TypeError, ValueError) as exc:
        raise TenantFileError(f"tenant {name!r}: {exc}") from exc
    if tenant.weight <= 0 or min(tenant.max_concurrent, tenant.max_queued, tenant.tokens_per_minute) < 0:
        raise TenantFileError(f"tenant {name!r}: weight must be > 0 and quotas >= 0")
    return tenant


def _check_disjoint(tenants: dict[str, Tenant]) -> None:
    """Refuse a token digest or identity listed under two tenants (which one would it authenticate?)."""
    owners: dict[bytes | str, str] = {}
    for tenant in tenants.values():
        listed: tuple[tuple[str, tuple[bytes | str, ...]], ...] = (
            ("token_sha256 entry", tenant.token_sha256),
            ("identity", tenant.identities),
        )
        for what, items in listed:
            for item in dict.fromkeys(items):  # repeated within one tenant: harmless
                other = owners.setdefault(item, tenant.name)
                if other != tenant.name:
                    # NOTE: the digest itself is not logged; tenants are named, which is enough to find it
                    shown = "" if isinstance(item, bytes) else f" {item!r}"
                    raise TenantFileError(
                        f"the same {what}{shown} is listed under tenants {other!r} and {tenant.name!r}"
                    )


def parse_table(text: str, toml: bool = False) -> TenantTable:
    """Parse the tenants file's text; raises TenantFileError (also for duplicate names, digests, identities)."""
    try:
        raw = tomllib.loads(text) if toml else json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKeyError as exc:
        # NOTE: plain json.loads would keep the last of two same-named tenants, so the first tenant's
        # tokens would stop working with nothing in the log. (TOML refuses duplicate keys by itself.)
        raise TenantFileError(
            f"{exc.key!r} is given twice in one object (tenant names and keys must be unique)"
        ) from exc
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise TenantFileError(f"cannot parse tenants file: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("tenants"), dict):
        raise TenantFileError("tenants file needs a 'tenants' table")
    tenants = {str(n): _tenant(str(n), t) for n, t in raw["tenants"].items()}
    _check_disjoint(tenants)
    open_services = frozenset(raw.get("open_services", DEFAULT_OPEN_SERVICES))
    open_paths = frozenset(raw.get("open_http_paths", DEFAULT_OPEN_HTTP_PATHS))
    return TenantTable(tenants, open_services, open_paths)


class TenantFile:
    """The current ``TenantTable`` of a file, reloaded when the file changes."""

    def __init__(self, path: str | Path, check_interval_s: float = 1.0) -> None:
        self.path = Path(path)
        self.check_interval_s = check_interval_s
        self._lock = threading.Lock()
        self._mtime = self._stat()
        self._checked = time.monotonic()
        self._table = parse_table(self.path.read_text(), self.path.suffix == ".toml")  # errors are fatal here
        self.reloads = 0

    def _stat(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size

    @property
    def table(self) -> TenantTable:
        """The tenants in force; checks the file's mtime at most every ``check_interval_s``."""
        now = time.monotonic()
        if now - self._checked >= self.check_interval_s:
            self._checked = now
            try:
                changed = self._stat() != self._mtime
            except OSError:
                changed = False
            if changed:
                self.reload()
        return self._table

    def reload(self) -> bool:
        """Re-read the file now (SIGHUP); False (and the old tenants kept) if it is unreadable or bad."""
        with self._lock:
            try:
                mtime = self._stat()
                table = parse_table(self.path.read_text(), self.path.suffix == ".toml")
            except (OSError, TenantFileError) as exc:
                log.error("tenants file %s not reloaded (previous tenants kept): %s", self.path, exc)
                return False
            self._table, self._mtime = table, mtime
            self.reloads += 1
        log.info("tenants file %s loaded: %d tenants", self.path, len(table.tenants))
        return True
