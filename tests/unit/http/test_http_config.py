"""Where the assembly puts the HTTP batch API's uploaded files for each ``--batch-db``."""

from __future__ import annotations

import pytest

from service.assembly import files_location, http_config
from service.config import load_config


@pytest.mark.parametrize(("batch_db", "expected"), [
    ("data/batch.db", ("sqlite", "data/batch-files.db")),
    ("/var/lib/inference/jobs.sqlite", ("sqlite", "/var/lib/inference/jobs-files.db")),
    (":memory:", ("sqlite", ":memory:")),
    ("sqlite://", ("sqlite", ":memory:")),
    ("sqlite:///data/batch.db", ("sqlite", "data/batch-files.db")),  # not a "sqlite:" directory
    ("sqlite:////srv/batch.db", ("sqlite", "/srv/batch-files.db")),
    ("postgresql://u@db:5432/jobs", ("postgres", "postgresql://u@db:5432/jobs")),
    ("postgres://u:pw@db/jobs?sslmode=require", ("postgres", "postgres://u:pw@db/jobs?sslmode=require")),
])
def test_files_live_where_the_batch_store_does(batch_db: str, expected: tuple[str, str]) -> None:
    assert files_location(batch_db) == expected


def test_a_postgresql_batch_db_gives_the_http_api_the_shared_file_store_and_keeps_the_url_out_of_the_repr() -> None:
    config = http_config(load_config(["--batch-db", "postgresql://u:secret@db:5432/jobs", "--http-port", "8000"],
                                     env={}))
    assert config is not None
    assert (config.files_store, config.files_db) == ("postgres", "postgresql://u:secret@db:5432/jobs")
    assert "secret" not in repr(config)
