"""Tenants, bearer-token auth, per-tenant quotas and TLS credentials."""
