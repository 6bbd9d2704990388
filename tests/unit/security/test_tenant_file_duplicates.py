"""A tenants file that names a tenant twice, or lists one token digest or identity under two tenants,
is refused: at start (fatal) and on reload (the previous tenants stay in force, the log says why)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from service.security.tenants import TenantFile, TenantFileError, parse_table


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# two "a" keys: json.dumps cannot write that, so the text is built by hand
DUPLICATE_NAME = (
    f'{{"tenants": {{"a": {{"token_sha256": ["{sha("t1")}"]}}, "a": {{"token_sha256": ["{sha("t2")}"]}}}}}}'
)
SHARED_DIGEST = json.dumps(
    {"tenants": {"a": {"token_sha256": [sha("t1")]}, "b": {"token_sha256": [sha("t1")]}}}
)
SHARED_IDENTITY = json.dumps(
    {"tenants": {"a": {"identities": ["spiffe://x/a"]}, "b": {"identities": ["spiffe://x/a"]}}}
)


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        (DUPLICATE_NAME, "'a' is given twice"),
        (SHARED_DIGEST, "token_sha256 entry is listed under tenants 'a' and 'b'"),
        (SHARED_IDENTITY, "identity 'spiffe://x/a' is listed under tenants 'a' and 'b'"),
    ],
)
def test_json_file_with_a_tenant_twice_or_shared_credentials_is_refused(doc: str, says: str) -> None:
    with pytest.raises(TenantFileError) as info:
        parse_table(doc)
    assert says in str(info.value)
    assert "\n" not in str(info.value)
    assert sha("t1") not in str(info.value)  # a digest is never printed


def test_toml_file_with_a_tenant_twice_is_refused() -> None:
    doc = f'[tenants.a]\ntoken_sha256 = ["{sha("t1")}"]\n[tenants.a]\ntoken_sha256 = ["{sha("t2")}"]\n'
    with pytest.raises(TenantFileError, match="cannot parse tenants file"):
        parse_table(doc, toml=True)


def test_a_digest_repeated_within_one_tenant_is_accepted() -> None:
    table = parse_table(json.dumps({"tenants": {"a": {"token_sha256": [sha("t1"), sha("t1")]}}}))
    assert table.by_token("t1") is not None and table.by_token("t1").name == "a"  # type: ignore[union-attr]


@pytest.mark.parametrize("doc", [DUPLICATE_NAME, SHARED_DIGEST])
def test_reload_of_a_file_with_duplicates_keeps_the_previous_tenants_and_logs_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, doc: str
) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(
        json.dumps({"tenants": {"a": {"token_sha256": [sha("t1")]}, "c": {"token_sha256": [sha("t3")]}}})
    )
    tenants = TenantFile(path)
    path.write_text(doc)
    with caplog.at_level(logging.ERROR, logger="service.auth"):
        assert tenants.reload() is False
    assert tenants.table.by_token("t1").name == "a"  # type: ignore[union-attr]
    assert tenants.table.by_token("t3").name == "c"  # type: ignore[union-attr]
    lines = [r.getMessage() for r in caplog.records if r.name == "service.auth"]
    assert len(lines) == 1 and "not reloaded (previous tenants kept)" in lines[0]
    assert "listed under tenants" in lines[0] or "given twice" in lines[0]
