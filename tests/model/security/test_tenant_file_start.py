"""The real server process refuses to start (exit code 2, one line) on a tenants file with duplicates."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from tests.support.server import ROOT, server_argv

pytestmark = pytest.mark.model


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ('{"tenants": {"a": {}, "a": {}}}', "'a' is given twice"),
        (
            json.dumps({"tenants": {"a": {"token_sha256": [sha("t")]}, "b": {"token_sha256": [sha("t")]}}}),
            "listed under tenants 'a' and 'b'",
        ),
    ],
)
def test_server_with_duplicates_in_its_tenants_file_exits_2_with_one_line(
    tmp_path: Path, doc: str, says: str
) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(doc)
    done = subprocess.run(
        server_argv("--auth-tokens", str(path)), cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "cannot start: --auth-tokens" in errors[0] and says in errors[0], done.stderr
