"""The tenants of one server, in one object: file, authentication, quotas and fair-share counters.

Without ``--auth-tokens`` there is one tenant, ``anonymous``: no interceptor,
no quotas, no fair-share work in the scheduler (the service behaves as before).
With it, ``interceptors()`` authenticates calls (``service.security.auth``), ``reserve``
applies the tenant's quotas before the engine sees the request
(``service.security.quotas``), and ``fair`` (unless ``--no-fair-share``) orders each
priority tier by tenant (``service.scheduler.fair_share``).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from service.observability.views import TenantFigures
from service.request.sequence import Sequence
from service.scheduler.fair_share import FairShare
from service.security.auth import AuthInterceptor, Credential, Denial, authenticate
from service.security.quotas import TenantQuotas
from service.security.tenants import ANONYMOUS, Tenant, TenantFile

log = logging.getLogger("service.auth")


class Tenancy:
    """Tenant lookups, quotas and counters for the servicer, scheduler and metrics."""

    def __init__(self, file: TenantFile | None = None, fair_share: bool = True) -> None:
        self.file = file
        self.quotas = TenantQuotas()
        self.fair = FairShare(self.weight) if file is not None and fair_share else None
        self.auth: AuthInterceptor | None = None

    @classmethod
    def from_file(cls, path: str, fair_share: bool = True) -> Tenancy:
        """From ``--auth-tokens`` (empty: no tenants) and ``--fair-share``; a bad file raises (fatal at start)."""
        return cls(TenantFile(path) if path else None, fair_share)

    @property
    def enabled(self) -> bool:
        return self.file is not None

    def interceptors(self, mtls: bool = False) -> list[Any]:
        """The authentication interceptor (none without a tenants file)."""
        if self.file is None:
            return []
        self.auth = AuthInterceptor(self.file, mtls=mtls)
        return [self.auth]

    def http_tenant(self, path: str, token: str | None, role: str) -> Credential | tuple[str, str]:
        """What an HTTP call on ``path`` runs as, or (gRPC status name, why) to refuse it.

        ``anonymous`` (a credential without a token digest: nothing to re-check) without a
        tenants file and on its ``open_http_paths``; else the bearer token's credential, whose
        tenant needs ``role`` (as the gRPC interceptor decides). Every call looks the token up
        in the file in force, so a revoked token is refused from its next call on.
        """
        if self.file is None:
            return Credential(ANONYMOUS, path)
        table = self.file.table  # NOTE: reloads a changed file first
        if path in table.open_http_paths:
            return Credential(ANONYMOUS, path)
        return authenticate(table, token, role, path)

    def tenant(self, name: str) -> Tenant | None:
        return self.file.table.tenants.get(name) if self.file is not None else None

    def weight(self, name: str) -> float:
        tenant = self.tenant(name)
        return tenant.weight if tenant is not None else 1.0

    def names(self) -> list[str]:
        """Tenants of the file (bounded: metrics label values come only from here)."""
        return sorted(self.file.table.tenants) if self.file is not None else [ANONYMOUS]

    def recheck(self, credential: Credential | None) -> Denial | None:
        """Is ``credential`` (what authenticated a long-lived stream) still good? None: yes, or no tenants."""
        if self.file is None or credential is None:
            return None
        return credential.recheck(self.file.table)  # NOTE: ``table`` reloads a changed file first

    def reload(self) -> None:
        """SIGHUP: re-read the tenants file now."""
        if self.file is not None:
            self.file.reload()

    def reserve(self, seq: Sequence) -> None:
        """Apply ``seq.tenant``'s quotas and reserve its tokens; raises QuotaExceeded (a QueueFull)."""
        self.quotas.reserve(seq, self.tenant(seq.tenant))

    def settle(self, seq: Sequence, refused: bool = False) -> None:
        """``seq`` ended (or was refused): its reservation becomes the tokens it used."""
        self.quotas.settle(seq, refused)

    def view(self) -> list[TenantFigures]:
        """Per-tenant figures for metrics: the file's tenants (or ``anonymous``), sorted by name."""
        names = self.names()
        books = self.quotas.snapshot(names)
        counters = self.fair.snapshot() if self.fair is not None else {}
        return [_figures(name, self.weight(name), books[name], counters.get(name, 0.0)) for name in names]

    def rows(self) -> list[dict[str, Any]]:
        """``view()`` as plain dicts (tests and ad-hoc reads)."""
        return [asdict(f) for f in self.view()]


def _figures(name: str, weight: float, books: dict[str, int], service: float) -> TenantFigures:
    """One tenant's row from its quota books (``TenantQuotas.snapshot``, which lists every name asked for).

    NOTE: indexed, not ``.get``: a key renamed in the quota books fails loudly here (and in
    ``tests/unit/security``) instead of reporting zeros.
    """
    return TenantFigures(
        tenant=name,
        weight=weight,
        requests=books["requests"],
        rejected=books["rejected"],
        finished=books["finished"],
        in_flight=books["in_flight"],
        queued=books["queued"],
        prompt_tokens=books["prompt_tokens"],
        generated_tokens=books["generated_tokens"],
        window_tokens=books["window_tokens"],
        service=service,
    )
