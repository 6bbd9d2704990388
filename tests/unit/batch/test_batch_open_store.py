"""``--batch-db`` values -> store kinds (pure: no database opened)."""

from __future__ import annotations

import pytest

from service.batch.open_store import StoreTarget, open_store, parse_batch_db, redact
from service.batch.sqlite_store import SqliteJobStore


@pytest.mark.parametrize(
    ("value", "kind", "location"),
    [
        ("data/batch.db", "sqlite", "data/batch.db"),
        ("/var/lib/batch.db", "sqlite", "/var/lib/batch.db"),
        (":memory:", "sqlite", ":memory:"),
        ("sqlite:///data/batch.db", "sqlite", "data/batch.db"),
        ("sqlite:////var/lib/batch.db", "sqlite", "/var/lib/batch.db"),
        ("sqlite://", "sqlite", ":memory:"),
        ("sqlite:///:memory:", "sqlite", ":memory:"),
        ("postgresql://u:pw@db:5432/jobs", "postgres", "postgresql://u:pw@db:5432/jobs"),
        ("postgres://db/jobs?sslmode=require", "postgres", "postgres://db/jobs?sslmode=require"),
        ("PostgreSQL://db/jobs", "postgres", "PostgreSQL://db/jobs"),
    ],
)
def test_batch_db_values_name_a_store(value: str, kind: str, location: str) -> None:
    assert parse_batch_db(value) == StoreTarget(kind, location)


@pytest.mark.parametrize("value", ["mysql://db/jobs", "postgresql+psycopg://db/jobs", "file:///tmp/x.db",
                                   "redis://cache"])
def test_an_unknown_scheme_is_refused_naming_the_accepted_ones(value: str) -> None:
    with pytest.raises(ValueError, match=r"unknown scheme .*sqlite:///path.*postgresql://"):
        parse_batch_db(value)


@pytest.mark.parametrize("value", ["", "sqlite://host/x.db", "sqlite:///"])
def test_empty_and_malformed_values_are_refused(value: str) -> None:
    with pytest.raises(ValueError):
        parse_batch_db(value)


def test_a_refusal_never_shows_the_password() -> None:
    with pytest.raises(ValueError) as err:
        parse_batch_db("mysql://u:secret@db/jobs")
    assert "secret" not in str(err.value)
    assert str(parse_batch_db("postgresql://u:secret@db:5432/jobs")) == "postgresql://u:***@db:5432/jobs"
    assert redact("postgresql://u:s@[::1]/j") == "postgresql://u:***@[::1]/j"
    assert redact("postgresql://db/jobs") == "postgresql://db/jobs"


def test_open_store_opens_sqlite_for_a_path() -> None:
    store = open_store("sqlite://", retention_s=60, replica_id="r1")
    try:
        assert isinstance(store, SqliteJobStore) and store.retention_s == 60
    finally:
        store.close()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch-db", "mysql://u:secret@db/jobs"], "unknown scheme 'mysql'"),
        (["--batch-db", ""], "--batch-db is empty"),
        (["--batch-lease-s", "0"], "--batch-lease-s must be > 0"),
    ],
)
def test_bad_batch_settings_fail_argument_parsing_with_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.config import load_config

    with pytest.raises(SystemExit) as exit_:
        load_config(argv, env={})
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "secret" not in err


def test_the_logged_configuration_masks_the_database_password_and_the_replica_id_defaults_to_the_host() -> None:
    import socket

    from service.assembly import batch_config
    from service.config import load_config

    config = load_config(["--batch-db", "postgresql://u:secret@db:5432/jobs?password=again"], env={})
    assert config.as_dict()["batch_db"] == "postgresql://u:***@db:5432/jobs?password=***"
    assert batch_config(config).replica_id == socket.gethostname()
    env = {"INFERENCE_REPLICA_ID": "inference-7d9f-abcde", "INFERENCE_BATCH_LEASE_S": "30"}
    pinned = batch_config(load_config([], env=env))
    assert (pinned.replica_id, pinned.lease_s) == ("inference-7d9f-abcde", 30.0)
