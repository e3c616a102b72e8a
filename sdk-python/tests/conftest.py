"""Fixtures: a fresh database per test on the real PostgreSQL and MariaDB and on SQLite, and the
real coordinator binary.

PostgreSQL is found through ``DTX_TEST_POSTGRES_URL``, MariaDB/MySQL through
``DTX_TEST_MYSQL_URL`` (defaults: the loopback servers of the development machine), the
coordinator through ``DTX_COORDINATOR_BIN`` (the Rust test that runs this suite sets it). When either is missing the test is skipped - unless ``CI=true``, where it
fails: CI must never go green by skipping.
"""

import os
import socket
import subprocess
import time
import uuid

import grpc
import pytest

import dtx

POSTGRES_URL = os.environ.get("DTX_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("DTX_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
IN_CI = os.environ.get("CI") in ("true", "1")

LEDGER = {
    "postgres": "CREATE TABLE ledger (xid TEXT, branch_id TEXT, action TEXT, payload BYTEA)",
    "mysql": "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, xid VARCHAR(128), "
    "branch_id VARCHAR(64), action VARCHAR(16), payload BLOB)",
    "sqlite": "CREATE TABLE ledger (xid TEXT, branch_id TEXT, action TEXT, payload BLOB)",
}
#: Insertion order of the ledger's rows, per dialect.
LEDGER_ORDER = {"postgres": "ctid", "mysql": "id", "sqlite": "rowid"}


def unavailable(what):
    if IN_CI:
        pytest.fail(f"{what} (CI=true: tests must not skip)")
    pytest.skip(what)


def _with_database(url, name):
    base, _, query = url.partition("?")
    scheme, _, rest = base.partition("://")
    host = rest.split("/", 1)[0]
    return f"{scheme}://{host}/{name}" + (f"?{query}" if query else "")


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def database(request, tmp_path):
    """A migrated barrier database with a ``ledger`` table for the business effects."""
    if request.param == "sqlite":
        db = dtx.Sqlite(str(tmp_path / "participant.db"))
        yield from _prepared(db)
        return
    if request.param == "mysql":
        yield from _mysql()
        return
    import psycopg

    name = f"dtx_t_py_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        unavailable(f"PostgreSQL at {POSTGRES_URL} is unreachable: {e}")
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        db = dtx.Postgres(_with_database(POSTGRES_URL, name))
        yield from _prepared(db)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _mysql():
    import pymysql

    name = f"dtx_t_py_{uuid.uuid4().hex[:12]}"
    admin_db = dtx.MySql(MYSQL_URL)
    try:
        admin = admin_db.connect()
    except pymysql.err.OperationalError as e:
        unavailable(f"MySQL/MariaDB at {MYSQL_URL} is unreachable: {e}")
    admin.cursor().execute(f"CREATE DATABASE `{name}`")
    try:
        db = dtx.MySql(_with_database(MYSQL_URL, name))
        yield from _prepared(db)
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()


def _prepared(db):
    db.migrate()
    conn = db.connect()
    conn.cursor().execute(LEDGER[db.dialect])
    conn.close()
    try:
        yield db
    finally:
        db.close()


def ledger(db, xid):
    """``[(branch_id, action, payload)]`` written by handlers, in insertion order."""
    conn = db.connect()
    try:
        cursor = conn.cursor()
        order = LEDGER_ORDER[db.dialect]
        cursor.execute(
            db.sql(f"SELECT branch_id, action, payload FROM ledger WHERE xid = ? ORDER BY {order}"),
            (xid,),
        )
        return [(b, a, bytes(p)) for b, a, p in cursor.fetchall()]
    finally:
        conn.close()


def recording(db, action):
    """A handler that writes one ledger row (the business effect) and succeeds, returning the
    payload as its result."""

    def handler(conn, call):
        conn.cursor().execute(
            db.sql("INSERT INTO ledger (xid, branch_id, action, payload) VALUES (?, ?, ?, ?)"),
            (call.xid, call.branch_id, action, call.payload),
        )
        return dtx.Reply.ok(b"done:" + call.payload)

    return handler


def refusing(db, action):
    """A handler that writes a ledger row and then refuses (the row must be undone)."""
    record = recording(db, action)

    def handler(conn, call):
        record(conn, call)
        return dtx.Reply.refuse(f"{action} refused by the test")

    return handler


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def coordinator(tmp_path):
    """The real coordinator binary on a free port and a SQLite store; a client to it."""
    yield from run_coordinator(tmp_path)


def run_coordinator(tmp_path, *flags):
    """Runs the coordinator binary with ``flags`` besides its address, store and poll; yields
    a client to it once it answers, and kills it after."""
    binary = os.environ.get("DTX_COORDINATOR_BIN")
    if not binary or not os.path.exists(binary):
        unavailable("DTX_COORDINATOR_BIN does not name the coordinator binary")
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            "--listen", f"127.0.0.1:{port}",
            "--store", f"sqlite://{tmp_path / 'coordinator.db'}",
            "--poll", "50ms",
            *flags,
        ],
        stdout=subprocess.DEVNULL,
        env={**os.environ, "RUST_LOG": "warn"},
    )
    client = dtx.Coordinator(f"http://127.0.0.1:{port}")
    try:
        grpc.channel_ready_future(client.channel).result(timeout=30)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.get("no-such-xid")
            except dtx.CoordinatorError as e:
                if e.code == grpc.StatusCode.NOT_FOUND or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        yield client
    finally:
        client.close()
        process.kill()
        process.wait()
