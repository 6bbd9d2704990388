"""The batch stores' schemas migrate a database written by the previous version (no thought column): it opens,
its old results read back with no thought (GetBatchResults: an empty, unset ``reasoning``), its job goes on, and
new results keep their thought.

The previous version's database is written here with its own schema (version 1, ``sqlite_schema.V1`` and
``pg_schema.V1``, never edited once released) and rows as that version's store wrote them.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from service.batch.convert import result_proto
from service.batch.store import ItemResult, ItemState, JobState, JobStore
from tests.support.clock import FakeClock

OLD_TEXT = "Paris, with <think>a thought</think> inside"  # the previous version kept the thought in the text
THOUGHT = ItemResult(text="{}", finish_reason="stop", prompt_tokens=4, completion_tokens=9, reasoning="hmm",
                     reasoning_tokens=5)


def _old_rows() -> tuple[tuple[object, ...], list[tuple[object, ...]]]:
    """A job in progress (as the previous store wrote it) with one completed item and one queued."""
    times = json.dumps({JobState.VALIDATING.value: 10.0, JobState.IN_PROGRESS.value: 11.0})
    job = ("batch_old", "t1", "", "{}", 86400, 0, "", JobState.IN_PROGRESS.value, times, 10.0, 86410.0)
    items = [("done", 1, b"req", b"", ItemState.COMPLETED.value, 1, 1, OLD_TEXT, "stop", 5, 12),
             ("next", 2, b"req", b"", ItemState.QUEUED.value, 0, None, "", "", 0, 0)]
    return job, items


def _assert_migrated(store: JobStore) -> None:
    """The old result reads back with an empty thought; the queued item runs and keeps its thought."""
    (old,) = store.results("t1", "batch_old", False, "", 10)
    assert old.result == ItemResult(text=OLD_TEXT, finish_reason="stop", prompt_tokens=5, completion_tokens=12)
    assert (old.result.reasoning, old.result.reasoning_tokens) == (None, 0)
    shown = result_proto(old)
    assert (shown.reasoning, shown.HasField("reasoning"), shown.text) == ("", False, OLD_TEXT)
    (claim,) = store.claim(5)
    assert claim.custom_id == "next" and store.finish(claim, ItemState.COMPLETED, THOUGHT)
    new = store.results("t1", "batch_old", False, "done", 10)
    assert [(r.custom_id, r.result) for r in new] == [("next", THOUGHT)]
    job = store.get_job("t1", "batch_old")
    assert job is not None and job.state is JobState.COMPLETED and job.usage.completion_tokens == 21


def test_a_sqlite_file_of_the_previous_version_opens_and_its_results_read_back_with_an_empty_thought(
    tmp_path: Path,
) -> None:
    from service.batch.sqlite_schema import LATEST, V1
    from service.batch.sqlite_store import SqliteJobStore

    path = str(tmp_path / "batch.db")
    job, items = _old_rows()
    with sqlite3.connect(path) as old:
        old.executescript(V1)
        old.execute("INSERT INTO jobs (id, tenant, display_name, metadata, window_s, priority, idem_key, state, "
                    "times, created_at, expires_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)", job)
        old.executemany("INSERT INTO items (job_id, custom_id, line, request, sort_key, state, attempts, done_seq, "
                        "text, finish_reason, prompt_tokens, completion_tokens) VALUES ('batch_old',?,?,?,?,?,?,?,?,?,?,?)",
                        items)
        old.execute("UPDATE jobs SET done_seq = 1")
        assert old.execute("PRAGMA user_version").fetchone() == (0,)  # the previous version kept none
    old.close()
    store = SqliteJobStore(path, clock=FakeClock())
    try:
        assert store.schema_version == LATEST == 2
        _assert_migrated(store)
    finally:
        store.close()
    again = SqliteJobStore(path, clock=FakeClock())  # a migrated file opens as it is
    try:
        assert again.schema_version == LATEST
        assert [r.result for r in again.results("t1", "batch_old", False, "done", 10)] == [THOUGHT]
    finally:
        again.close()


def test_a_postgres_database_of_the_previous_version_migrates_and_its_results_read_back_with_an_empty_thought(
    tmp_path: Path,
) -> None:
    from tests.support.pg import fresh_database  # a throwaway PostgreSQL (skipped without one, failed in CI)

    dsn = fresh_database(str(tmp_path))
    import psycopg

    from service.batch.pg_schema import LATEST, V1
    from service.batch.postgres_store import PostgresJobStore

    job, items = _old_rows()
    with psycopg.connect(dsn, autocommit=True) as old:
        old.execute("CREATE TABLE batch_schema_version (version integer PRIMARY KEY, applied_at timestamptz NOT NULL "
                    "DEFAULT now())")
        for sql in V1:
            old.execute(sql)
        old.execute("INSERT INTO batch_schema_version (version) VALUES (1)")
        old.execute("INSERT INTO batch_jobs (id, tenant, display_name, metadata, window_s, priority, idem_key, state, "
                    "times, created_at, expires_at, done_seq) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,1)", job)
        for cid, line, request, key, state, attempts, done_seq, text, finish, prompt, completion in items:
            old.execute("INSERT INTO batch_items (job_id, custom_id, line, request, sort_key, state, attempts) "
                        "VALUES ('batch_old', %s, %s, %s, %s, %s, %s)", (cid, line, request, key, state, attempts))
            if done_seq is not None:
                old.execute("INSERT INTO batch_results (job_id, custom_id, done_seq, state, attempts, text, "
                            "finish_reason, prompt_tokens, completion_tokens) VALUES ('batch_old', %s, %s, %s, %s, "
                            "%s, %s, %s, %s)", (cid, done_seq, state, attempts, text, finish, prompt, completion))
    store = PostgresJobStore(dsn, "r1", clock=FakeClock())
    try:
        assert store.schema_version == LATEST == 2
        _assert_migrated(store)
        with psycopg.connect(dsn) as conn:
            versions = [r[0] for r in conn.execute("SELECT version FROM batch_schema_version ORDER BY version")]
        assert versions == [1, 2]
    finally:
        store.close()


def test_a_sqlite_file_of_a_newer_version_still_opens(tmp_path: Path) -> None:
    from service.batch.sqlite_store import SqliteJobStore

    newer = 7
    path = str(tmp_path / "batch.db")
    SqliteJobStore(path, clock=FakeClock()).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version={newer}")
    db.close()
    store = SqliteJobStore(path, clock=FakeClock())  # a rolling downgrade: it logs a warning and goes on
    try:
        assert store.schema_version == newer
    finally:
        store.close()
