"""The databases the barrier runs on: PostgreSQL (psycopg 3), MySQL/MariaDB (PyMySQL) and SQLite
(the standard library).

The barrier is written once against :class:`Tx` (``?`` placeholders, an insert that ignores a
duplicate key, a locking read of an existing row, savepoints); the dialect supplies what differs.
Connections are in autocommit mode and transactions are begun explicitly, so every transaction
is the barrier's own: ``BEGIN`` on PostgreSQL (READ COMMITTED: a duplicate insert waits for the
first inserter's commit and the next statement reads its committed row; MySQL's READ COMMITTED
as the Rust SDK sets it, so duplicate-key checks take no gap locks), ``BEGIN IMMEDIATE`` on SQLite
(the write lock up front, so a transaction that reads before it writes never fails to upgrade).

:meth:`Database.migrate` applies the barrier schema from the same SQL files as the Rust SDK and
records them in the same ``dtx_migrations_barrier`` table, with sqlx's checksums, so a Rust and
a Python participant may share one database and either may migrate it first.
"""

import hashlib
import importlib.resources
import queue
import sqlite3
import threading
import time
import zlib
from contextlib import contextmanager

MIGRATIONS_TABLE = "dtx_migrations_barrier"


class Database:
    """A database and a small pool of connections to it (one per concurrent call)."""

    #: Folder of ``dtx/migrations`` holding this dialect's barrier schema.
    dialect = ""

    def __init__(self, max_connections=16):
        self._idle = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(max_connections)

    # -- what a dialect supplies -----------------------------------------------------------

    def connect(self):
        """A new DB-API connection in autocommit mode."""
        raise NotImplementedError

    def begin_sql(self):
        return "BEGIN"

    def sql(self, text):
        """``text`` with ``?`` placeholders, in this driver's paramstyle."""
        return text

    def insert_ignore(self, rest):
        """``INSERT`` of ``rest`` (``table (cols) VALUES (..)``) that skips a duplicate key."""
        raise NotImplementedError

    def share_lock(self):
        """Suffix of a read that waits for a concurrent writer of the row."""
        return ""

    def is_lock_conflict(self, error):
        """True for a deadlock / busy error after which running the transaction again is right."""
        return False

    def _lock_migrations(self, cursor):
        pass

    def _unlock_migrations(self, cursor):
        pass

    def _migrations_ddl(self):
        raise NotImplementedError

    def _statements(self, script):
        """The statements of a migration file, in order."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------

    @contextmanager
    def transaction(self):
        """A :class:`Tx` on a pooled connection: committed when the block ends, rolled back if
        it raises. A connection whose rollback fails is closed, never reused."""
        with self._connection() as conn:
            tx = Tx(self, conn)
            tx.execute(self.begin_sql())
            try:
                yield tx
            except BaseException:
                try:
                    conn.cursor().execute("ROLLBACK")
                except Exception:
                    conn.close()
                    raise
                raise
            conn.cursor().execute("COMMIT")

    @contextmanager
    def _connection(self):
        self._slots.acquire()
        conn = None
        try:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = self.connect()
            yield conn
        except BaseException:
            if conn is not None and _is_broken(conn):
                conn = None
            raise
        finally:
            if conn is not None and not _is_broken(conn):
                self._idle.put(conn)
            self._slots.release()

    def close(self):
        """Closes the idle connections."""
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

    def migrate(self):
        """Creates or upgrades ``dtx_barrier``; safe to run concurrently and repeatedly."""
        conn = self.connect()
        try:
            cursor = conn.cursor()
            self._lock_migrations(cursor)
            try:
                cursor.execute(self._migrations_ddl())
                for version, description, script in migrations(self.dialect):
                    # Each migration and its bookkeeping row commit together; the check runs
                    # inside the transaction, so a concurrent migrator (SQLite's write lock,
                    # PostgreSQL's advisory lock) never applies one twice.
                    started = time.monotonic_ns()
                    cursor.execute(self.begin_sql())
                    try:
                        self._apply(cursor, version, description, script, started)
                    except BaseException:
                        cursor.execute("ROLLBACK")
                        raise
                    cursor.execute("COMMIT")
            finally:
                self._unlock_migrations(cursor)
        finally:
            conn.close()

    def _apply(self, cursor, version, description, script, started):
        checksum = hashlib.sha384(script.encode()).digest()
        cursor.execute(
            self.sql(f"SELECT checksum FROM {MIGRATIONS_TABLE} WHERE version = ?"), (version,)
        )
        applied = cursor.fetchone()
        if applied is not None:
            if bytes(applied[0]) != checksum:
                raise RuntimeError(
                    f"barrier migration {version} ({description}) was applied with different "
                    "content than this package ships"
                )
            return
        for statement in self._statements(script):
            cursor.execute(statement)
        cursor.execute(
            self.sql(
                f"INSERT INTO {MIGRATIONS_TABLE} "
                "(version, description, success, checksum, execution_time) VALUES (?, ?, ?, ?, ?)"
            ),
            (version, description, True, checksum, time.monotonic_ns() - started),
        )


def _is_broken(conn):
    # psycopg says `closed`, PyMySQL `open`; sqlite3 connections only break when closed by us.
    return bool(getattr(conn, "closed", False)) or getattr(conn, "open", True) is False


def migrations(dialect):
    """``(version, description, sql)`` of the shipped barrier migrations, oldest first, named
    and described as sqlx does (``0002_a_b.sql`` -> version 2, description ``a b``)."""
    folder = importlib.resources.files("dtx").joinpath("migrations", dialect)
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if not name.endswith(".sql") or "_" not in name:
            continue
        version, description = name[: -len(".sql")].split("_", 1)
        found.append((int(version), description.replace("_", " "), entry.read_text("utf-8")))
    return sorted(found)


class Tx:
    """One open transaction: what the barrier writes through, and what handlers get as
    ``tx.conn`` (the driver's own connection, for the business change in the same commit)."""

    def __init__(self, database, conn):
        self.database = database
        self.conn = conn

    def execute(self, sql, args=()):
        """Runs ``sql`` (``?`` placeholders); returns the number of rows it changed."""
        cursor = self.conn.cursor()
        cursor.execute(self.database.sql(sql), args)
        return cursor.rowcount

    def fetchone(self, sql, args=()):
        cursor = self.conn.cursor()
        cursor.execute(self.database.sql(sql), args)
        return cursor.fetchone()


class Postgres(Database):
    """PostgreSQL through psycopg 3: ``Postgres("postgresql://user@host/db")``."""

    dialect = "postgres"

    def __init__(self, url, max_connections=16):
        super().__init__(max_connections)
        self.url = url

    def connect(self):
        import psycopg

        return psycopg.connect(self.url, autocommit=True)

    def sql(self, text):
        # Our SQL has no literal `?` or `%`.
        return text.replace("?", "%s")

    def insert_ignore(self, rest):
        return f"INSERT INTO {rest} ON CONFLICT DO NOTHING"

    def share_lock(self):
        return " FOR SHARE"

    def is_lock_conflict(self, error):
        # deadlock_detected, serialization_failure
        return getattr(error, "sqlstate", None) in ("40P01", "40001")

    def _lock_migrations(self, cursor):
        # The advisory lock sqlx's migrator takes, so Rust and Python migrations serialize.
        cursor.execute("SELECT current_database()")
        (name,) = cursor.fetchone()
        cursor.execute("SELECT pg_advisory_lock(%s)", (_sqlx_lock_id(name),))
        self._lock_name = name

    def _unlock_migrations(self, cursor):
        cursor.execute("SELECT pg_advisory_unlock(%s)", (_sqlx_lock_id(self._lock_name),))

    def _migrations_ddl(self):
        return (
            f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} ("
            "version BIGINT PRIMARY KEY, description TEXT NOT NULL, "
            "installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL, "
            "checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)"
        )

    def _statements(self, script):
        # psycopg sends a parameterless multi-statement string in one go.
        return [script]


def _sqlx_lock_id(database_name):
    return 0x3D32AD9E * zlib.crc32(database_name.encode())


class MySql(Database):
    """MySQL or MariaDB through PyMySQL: ``MySql("mysql://user:password@host:3306/db")``."""

    dialect = "mysql"

    def __init__(self, url, max_connections=16):
        super().__init__(max_connections)
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(url)
        if parts.scheme not in ("mysql", "mariadb") or not parts.path.strip("/"):
            raise ValueError(f"{url!r} is not a mysql://user@host:port/database URL")
        self._params = dict(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            database=parts.path.strip("/"),
        )

    def connect(self):
        import pymysql

        conn = pymysql.connect(**self._params, autocommit=True, charset="utf8mb4")
        conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return conn

    def begin_sql(self):
        return "START TRANSACTION"

    def sql(self, text):
        return text.replace("?", "%s")

    def insert_ignore(self, rest):
        # As the Rust SDK: IGNORE also skips data errors, but every value here is checked first.
        return f"INSERT IGNORE INTO {rest}"

    def share_lock(self):
        return " LOCK IN SHARE MODE"

    def is_lock_conflict(self, error):
        import pymysql

        # ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT
        return isinstance(error, pymysql.err.OperationalError) and error.args[:1] in (
            (1213,),
            (1205,),
        )

    def _lock_migrations(self, cursor):
        # The named lock sqlx's MySQL migrator takes, so Rust and Python migrations serialize.
        cursor.execute("SELECT DATABASE()")
        (self._lock_name,) = cursor.fetchone()
        cursor.execute("SELECT GET_LOCK(%s, -1)", (f"{_sqlx_lock_id(self._lock_name):x}",))

    def _unlock_migrations(self, cursor):
        cursor.execute("SELECT RELEASE_LOCK(%s)", (f"{_sqlx_lock_id(self._lock_name):x}",))

    def _migrations_ddl(self):
        return (
            f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} ("
            "version BIGINT PRIMARY KEY, description TEXT NOT NULL, "
            "installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, success BOOLEAN NOT NULL, "
            "checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)"
        )

    def _statements(self, script):
        # MySQL DDL commits implicitly, so the files are written to be re-runnable; a statement
        # ends with a `;` at the end of a line (comments go with the next statement).
        statements, current = [], ""
        for line in script.splitlines(keepends=True):
            current += line
            if line.rstrip().endswith(";") and not line.lstrip().startswith("--"):
                statements.append(current)
                current = ""
        return statements


class Sqlite(Database):
    """SQLite through the standard library: ``Sqlite("/var/lib/app/app.db")``. WAL mode and a
    30 s busy timeout, as the Rust SDK sets them."""

    dialect = "sqlite"

    def __init__(self, path, max_connections=8):
        super().__init__(max_connections)
        self.path = path

    def connect(self):
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def begin_sql(self):
        return "BEGIN IMMEDIATE"

    def insert_ignore(self, rest):
        return f"INSERT OR IGNORE INTO {rest}"

    def is_lock_conflict(self, error):
        return isinstance(error, sqlite3.OperationalError) and (
            "locked" in str(error) or "busy" in str(error)
        )

    def _migrations_ddl(self):
        return (
            f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} ("
            "version BIGINT PRIMARY KEY, description TEXT NOT NULL, "
            "installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, success BOOLEAN NOT NULL, "
            "checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)"
        )

    def _statements(self, script):
        # `executescript` would commit first; split where SQLite's own parser says a statement
        # ends instead, so each migration and its bookkeeping row commit together.
        statements, current = [], ""
        for line in script.splitlines(keepends=True):
            current += line
            if sqlite3.complete_statement(current):
                statements.append(current)
                current = ""
        if any(line.strip() and not line.strip().startswith("--") for line in current.splitlines()):
            raise RuntimeError(f"migration ends in an unterminated statement: {current!r}")
        return statements


def from_url(url, max_connections=16):
    """The :class:`Database` a store URL names, spelled as the Rust SDK and the coordinator take
    them: ``postgres://`` / ``postgresql://``, ``mysql://`` / ``mariadb://``, ``sqlite://FILE``."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme in ("postgres", "postgresql"):
        return Postgres(url, max_connections)
    if scheme in ("mysql", "mariadb"):
        return MySql(url, max_connections)
    if scheme == "sqlite":
        path = url[len("sqlite://") :].split("?", 1)[0]
        if path:
            return Sqlite(path, max_connections)
    raise ValueError(f"{url!r} is not a postgres://, mysql:// or sqlite://FILE URL")
