"""Per-episode databases for DBBench: embedded SQLite, or a MariaDB server.

Each episode gets a fresh database holding only its own tables, loaded as AgentBench loads them
(every column ``TEXT``, every value ``str(v)``), and dropped at the end.

- :class:`SQLiteBackend`: an in-memory SQLite database per episode; no server. The agent's SQL is
  MySQL-flavoured (the prompt says MySQL), so some statements fail here that MySQL would run. It
  runs in the worker process, so SQLite's authorizer denies it every way to the host's files:
  ``ATTACH`` of a file and ``VACUUM INTO`` a file, ``load_extension()``, and the pragmas that
  name a folder (:func:`deny_file_access`): they fail with ``not authorized``.
- :class:`MariaDBBackend`: a database *and a user allowed only that database* per episode on one
  MariaDB server (the agent cannot see or drop other episodes' data). Sessions run with
  ``sql_mode='NO_ENGINE_SUBSTITUTION'`` (non-strict, as the ``answer_md5`` values need: with
  strict mode two gold UPDATEs of ``standard`` fail) and ``max_statement_time``.

Results are shown as AgentBench shows them: ``str()`` of the list of row tuples, cut at 800
characters with ``[TRUNCATED]``. SQL errors go back to the agent as text; a database that cannot
be reached raises :class:`DatabaseUnavailable` (the episode ends with ``task error``).

What the agent's SQL does to its own MariaDB connection is the agent's doing, not a server
failure: ``KILL CONNECTION_ID()``, ``SET SESSION wait_timeout = 1`` then idling, or a
``SET PASSWORD`` followed by a lost connection. When the agent's connection is gone the episode
asks the server as administrator: a server that answers gets the episode's user, password and
database restored and a new connection (as AgentBench reconnects before each statement), and the
agent sees the error as text; only a server the administrator cannot reach is
:class:`DatabaseUnavailable`. Errors such as ``GRANT ... TO CURRENT_USER()``'s access denied
(1045) are SQL errors like any other.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import secrets
import sqlite3
import time
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from .checking import GROUP_CONCAT_MAX_LEN, combined_hash, table_hash
from .data import Table

logger = logging.getLogger(__name__)

MAX_RESULT_CHARS = 800
TRUNCATED = "[TRUNCATED]"
TIMEOUT_MESSAGE = "Error: SQL execution timed out."
T = TypeVar("T")
Runner = Callable[[Callable[[], Any]], Awaitable[Any]]
"""Runs a blocking call on the backend's threads (:meth:`DatabaseBackend.run`)."""


class DatabaseUnavailable(Exception):
    """The database server cannot be used (down, unreachable, access denied): not the agent's fault."""


def show_result(rows: Sequence[Sequence[Any]]) -> str:
    """Rows as the agent sees them: ``[('a', 1), ...]``, at most 800 characters then ``[TRUNCATED]``."""
    text = str([tuple(row) for row in rows])
    return text[:MAX_RESULT_CHARS] + TRUNCATED if len(text) > MAX_RESULT_CHARS else text


def quote_name(name: str) -> str:
    """A MySQL/SQLite identifier in backticks (backticks inside doubled)."""
    return "`" + name.replace("`", "``") + "`"


def create_statements(table: Table, mark: str) -> tuple[str, str, list[tuple[str, ...]]]:
    """``CREATE TABLE`` (all TEXT), the ``INSERT`` template and its rows, for one table.

    ``mark`` is the driver's placeholder: ``?`` (sqlite3) or ``%s`` (pymysql, which then needs
    a ``%`` in a name doubled, as in a column named ``Win %``).
    """
    columns = ", ".join(f"{quote_name(c)} TEXT" for c in table.columns)
    create = f"CREATE TABLE IF NOT EXISTS {quote_name(table.name)} ({columns})"

    def escaped(name: str) -> str:
        return quote_name(name).replace("%", "%%") if mark == "%s" else quote_name(name)

    names = ", ".join(escaped(c) for c in table.columns)
    marks = ", ".join([mark] * len(table.columns))
    return create, f"INSERT INTO {escaped(table.name)} ({names}) VALUES ({marks})", list(table.rows)


def hash_query(table: Table) -> str:
    """AgentBench's table-hash query (MySQL)."""
    columns = ", ".join(quote_name(c) for c in table.columns)
    return (
        "select md5(group_concat(rowhash order by rowhash)) as hash from ("
        f"SELECT substring(MD5(CONCAT_WS(',', {columns})), 1, 5) AS rowhash FROM {quote_name(table.name)}) as sub"
    )


class EpisodeDatabase(ABC):
    """One episode's database."""

    def __init__(self, run: Runner) -> None:
        self._run = run

    @abstractmethod
    def _execute(self, sql: str) -> str: ...

    @abstractmethod
    def _tables_hash(self, tables: Sequence[Table]) -> str: ...

    @abstractmethod
    def _close(self) -> None: ...

    async def execute(self, sql: str) -> str:
        """Run one agent statement; its result or error as text."""
        return str(await self._run(lambda: self._execute(sql)))

    async def tables_hash(self, tables: Sequence[Table]) -> str:
        """AgentBench's combined hash of ``tables`` as they are now."""
        return str(await self._run(lambda: self._tables_hash(tables)))

    async def close(self) -> None:
        """Drop the database (idempotent; never raises)."""
        try:
            await self._run(self._close)
        except Exception:  # cleanup must not hide the episode's outcome
            logger.warning("closing an episode database failed", exc_info=True)


class DatabaseBackend(ABC):
    """Creates per-episode databases; owns the threads their blocking calls run on."""

    name: str = ""

    def __init__(self, threads: int, statement_timeout_s: float) -> None:
        if statement_timeout_s <= 0:
            raise ValueError(f"statement_timeout_s must be positive, got {statement_timeout_s!r}")
        self.statement_timeout_s = statement_timeout_s
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, threads), thread_name_prefix=f"dbbench-{self.name}"
        )

    async def run(self, call: Callable[[], T]) -> T:
        """Run a blocking database call on the backend's threads."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    @abstractmethod
    async def open(self, tables: Sequence[Table]) -> EpisodeDatabase:
        """A fresh database holding ``tables``."""

    async def check(self) -> None:
        """Raise :class:`DatabaseUnavailable` when the backend cannot serve episodes."""
        return None

    async def close(self) -> None:
        """Release the backend's threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------------------------------- SQLite


def _sqlite_md5(value: Any) -> str | None:
    return None if value is None else hashlib.md5(str(value).encode("utf-8")).hexdigest()


_IN_MEMORY_ATTACH = ("", ":memory:")  # ATTACH of a temporary or in-memory database; plain VACUUM
_DENIED_FUNCTIONS = {"load_extension", "fts3_tokenizer"}
_DENIED_PRAGMAS = {"temp_store_directory", "data_store_directory"}


def deny_file_access(
    action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None
) -> int:
    """SQLite authorizer of the agent's SQL: no file on the host may be opened, written or loaded.

    ``ATTACH 'path'`` and ``VACUUM INTO 'path'`` (which SQLite authorizes as an ATTACH of
    ``path``) create or open files; ``load_extension()`` loads a shared library; the directory
    pragmas move temporary files. Everything else the agent's SQL does stays in its in-memory
    database.
    """
    if action == sqlite3.SQLITE_ATTACH and (arg1 or "") not in _IN_MEMORY_ATTACH:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in _DENIED_PRAGMAS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


class SQLiteEpisode(EpisodeDatabase):
    """An in-memory SQLite database."""

    def __init__(self, run: Runner, timeout_s: float) -> None:
        super().__init__(run)
        self._timeout_s = timeout_s
        self._deadline = float("inf")
        self.conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self.conn.create_function("md5", 1, _sqlite_md5, deterministic=True)
        # Interrupts a statement past its deadline (checked every 10k VM instructions).
        self.conn.set_progress_handler(lambda: int(time.monotonic() > self._deadline), 10_000)
        self.conn.set_authorizer(deny_file_access)  # the agent's SQL runs in the worker process

    def load(self, tables: Sequence[Table]) -> None:
        for table in tables:
            create, insert, rows = create_statements(table, "?")
            self.conn.execute(create)
            self.conn.executemany(insert, rows)

    def _execute(self, sql: str) -> str:
        self._deadline = time.monotonic() + self._timeout_s
        try:
            cursor = self.conn.execute(sql)
            rows = cursor.fetchall() if cursor.description else []
        except sqlite3.OperationalError as exc:
            if str(exc) == "interrupted":
                return TIMEOUT_MESSAGE
            return f"SQLite execution error: {exc}"
        except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as exc:
            return f"SQLite execution error: {exc}"
        finally:
            self._deadline = float("inf")
            if self.conn.in_transaction:  # an agent's BEGIN without COMMIT: keep autocommit semantics
                self.conn.commit()
        return show_result(rows)

    def _tables_hash(self, tables: Sequence[Table]) -> str:
        hashes = []
        for table in tables:
            columns = ", ".join(quote_name(c) for c in table.columns)
            try:
                rows = self.conn.execute(f"SELECT {columns} FROM {quote_name(table.name)}").fetchall()
            except sqlite3.Error as exc:  # the agent dropped or altered the table
                hashes.append(f"error: {exc}")
                continue
            hashes.append(table_hash(rows))
        return combined_hash(hashes)

    def _close(self) -> None:
        self.conn.interrupt()  # a statement may still run on another thread (the session was cancelled)
        self.conn.close()


class SQLiteBackend(DatabaseBackend):
    """Embedded default: an in-memory SQLite database per episode."""

    name = "sqlite"

    async def open(self, tables: Sequence[Table]) -> EpisodeDatabase:
        def create() -> SQLiteEpisode:
            episode = SQLiteEpisode(self.run, self.statement_timeout_s)
            try:
                episode.load(tables)
            except BaseException:
                episode.conn.close()
                raise
            return episode

        return await self.run(create)


# --------------------------------------------------------------------------------------- MariaDB


@dataclass(frozen=True)
class ServerAddress:
    """How to reach a MariaDB/MySQL server as an administrator (who may create databases and users).

    From a URL: ``mysql://USER:PASSWORD@HOST:PORT`` or ``unix:///path/to/mysqld.sock?user=root``
    (``mariadb://`` is the same as ``mysql://``; user defaults to root, port to 3306). TLS is off
    unless the URL says ``?tls=1`` (a server on this machine gains nothing from it, and setting up
    a TLS context costs ~50 ms per connection).
    """

    host: str | None = None
    port: int = 3306
    unix_socket: str | None = None
    user: str = "root"
    password: str = ""
    tls: bool = False

    @classmethod
    def from_url(cls, url: str) -> ServerAddress:
        parsed = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qs(parsed.query)
        tls = query.get("tls", ["0"])[0].lower() in ("1", "true", "yes")
        if parsed.scheme == "unix":
            if not parsed.path:
                raise ValueError(f"MariaDB URL {url!r} names no socket; expected unix:///path/to/mysqld.sock")
            return cls(
                unix_socket=parsed.path,
                user=query.get("user", ["root"])[0],
                password=query.get("password", [""])[0],
                tls=tls,
            )
        if parsed.scheme in ("mysql", "mariadb") and parsed.hostname:
            return cls(
                host=parsed.hostname,
                port=parsed.port or 3306,
                user=urllib.parse.unquote(parsed.username or "root"),
                password=urllib.parse.unquote(parsed.password or ""),
                tls=tls,
            )
        raise ValueError(
            f"MariaDB URL {url!r} not understood; expected mysql://USER:PASSWORD@HOST:PORT "
            "or unix:///path/to/mysqld.sock?user=root"
        )

    def describe(self) -> str:
        """Where the server is, without the password."""
        return f"unix:{self.unix_socket}" if self.unix_socket else f"{self.host}:{self.port}"


# MariaDB/MySQL errors after which the connection may be gone (server gone away, lost during
# the query, commands out of sync, killed, shutdown in progress): whether the server is down or
# only the agent's connection ended is then asked of the server (MariaDBEpisode._reconnect).
_LOST_CONNECTION_ERRORS = {2006, 2013, 2014, 2055, 1053, 1927, 4031}
_STATEMENT_TIMEOUT_ERRORS = {1969, 3024}  # MariaDB max_statement_time, MySQL max_execution_time


class MariaDBEpisode(EpisodeDatabase):
    """One database and one user, both dropped at the end, on a shared MariaDB server."""

    def __init__(self, run: Runner, backend: MariaDBBackend, token: str) -> None:
        super().__init__(run)
        self.backend = backend
        self.database = f"dbbench_{token}"
        self.user = f"dbbench_{token}"
        self._password = secrets.token_hex(12)
        self.conn: Any = None

    def create(self, tables: Sequence[Table]) -> None:
        backend = self.backend
        with backend.admin() as admin, admin.cursor() as cursor:
            cursor.execute(
                f"CREATE DATABASE {quote_name(self.database)} CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_520_ci"
            )
            cursor.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (self.user, self._password))
            # In GRANT, '_' in a database name is a wildcard: escape it.
            grant_db = quote_name(self.database.replace("_", "\\_"))
            cursor.execute(f"GRANT ALL PRIVILEGES ON {grant_db}.* TO %s@'%%'", (self.user,))
        self._connect()
        with self.conn.cursor() as cursor:
            for table in tables:
                create, insert, rows = create_statements(table, "%s")
                cursor.execute(create)
                if rows:
                    cursor.executemany(insert, rows)

    def _connect(self) -> None:
        """A new connection as the episode's user, with the episode's session settings."""
        self.conn = self.backend.connect(user=self.user, password=self._password, database=self.database)
        with self.conn.cursor() as cursor:
            cursor.execute(
                "SET SESSION sql_mode = 'NO_ENGINE_SUBSTITUTION', max_statement_time = %s",
                (self.backend.statement_timeout_s,),
            )

    def _reconnect(self) -> None:
        """The agent's connection is gone: DatabaseUnavailable if the server is, else a new one.

        The administrator restores what the agent's SQL may have changed about its own account
        (password, lock, its database) before the episode's user connects again.
        """
        old, self.conn = self.conn, None
        try:
            old.close()
        except Exception:  # already closed by the server or by pymysql
            pass
        with self.backend.admin() as admin, admin.cursor() as cursor:  # DatabaseUnavailable: server down
            cursor.execute("ALTER USER %s@'%%' IDENTIFIED BY %s ACCOUNT UNLOCK", (self.user, self._password))
            cursor.execute(
                f"CREATE DATABASE IF NOT EXISTS {quote_name(self.database)} "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_520_ci"
            )
        logger.info("dbbench episode %s: the agent's connection ended; reconnected", self.database)
        self._connect()

    def _ensure_connected(self) -> None:
        """Before a statement: the guard on statement time again (the agent may have lifted it
        with ``SET SESSION max_statement_time = 0``), which also finds a connection the agent ended."""
        import pymysql

        try:
            with self.conn.cursor() as cursor:
                cursor.execute("SET SESSION max_statement_time = %s", (self.backend.statement_timeout_s,))
        except pymysql.err.MySQLError:
            self._reconnect()

    def _execute(self, sql: str) -> str:
        import pymysql

        self._ensure_connected()
        try:
            with self.conn.cursor() as cursor:
                cursor.execute(sql)
                rows = cursor.fetchall() if cursor.description else []
        except pymysql.err.MySQLError as exc:
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
            if code in _LOST_CONNECTION_ERRORS or isinstance(exc, pymysql.err.InterfaceError):
                self._ensure_connected()  # server down: DatabaseUnavailable; else the agent's error
            if code in _STATEMENT_TIMEOUT_ERRORS:
                return TIMEOUT_MESSAGE
            message = exc.args[1] if len(exc.args) > 1 else str(exc)
            return f"{code}: {message}" if code is not None else str(message)
        except (ValueError, TypeError) as exc:  # e.g. a '%' sequence pymysql cannot format
            return f"Error executing query: {exc}"
        return show_result(rows)

    def _tables_hash(self, tables: Sequence[Table]) -> str:
        import pymysql

        hashes = []
        self._ensure_connected()  # the agent may have ended its connection after its last statement
        with self.conn.cursor() as cursor:
            cursor.execute("SET SESSION group_concat_max_len = %s", (GROUP_CONCAT_MAX_LEN,))
            for table in tables:
                try:
                    cursor.execute(hash_query(table))
                    value = cursor.fetchone()[0]
                except pymysql.err.MySQLError as exc:
                    code = exc.args[0] if exc.args else None
                    if code in _LOST_CONNECTION_ERRORS or isinstance(exc, pymysql.err.InterfaceError):
                        raise DatabaseUnavailable(f"MariaDB failed while hashing the tables: {exc}") from exc
                    hashes.append(f"error: {exc}")
                    continue
                hashes.append("None" if value is None else str(value))
        return combined_hash(hashes)

    def _close(self) -> None:
        conn, self.conn = self.conn, None
        with self.backend.admin() as admin, admin.cursor() as cursor:
            if conn is not None:
                # A statement may still run on another thread (the session was cancelled):
                # end the connection on the server first, then close our side.
                try:
                    cursor.execute("KILL CONNECTION %s", (conn.thread_id(),))
                except Exception:
                    pass
                try:
                    conn.close()
                except Exception:
                    pass
            cursor.execute(f"DROP DATABASE IF EXISTS {quote_name(self.database)}")
            cursor.execute("DROP USER IF EXISTS %s@'%%'", (self.user,))


class MariaDBBackend(DatabaseBackend):
    """Per-episode databases and users on one MariaDB (or MySQL) server at ``address``."""

    name = "mariadb"

    def __init__(self, address: ServerAddress, threads: int, statement_timeout_s: float) -> None:
        super().__init__(threads, statement_timeout_s)
        self.address = address
        self._token = secrets.token_hex(4)  # this worker's episodes: dbbench_<token>_<n>
        self._numbers = itertools.count(1)

    def connect(self, user: str, password: str, database: str | None = None) -> Any:
        """A new autocommit connection (utf8mb4); DatabaseUnavailable when the server cannot be reached."""
        import pymysql

        where = (
            {"unix_socket": self.address.unix_socket}
            if self.address.unix_socket
            else {"host": self.address.host, "port": self.address.port}
        )
        try:
            return pymysql.connect(
                **where,
                user=user,
                password=password,
                database=database,
                charset="utf8mb4",
                autocommit=True,
                ssl_disabled=not self.address.tls,
                connect_timeout=10,
                read_timeout=self.statement_timeout_s + 30,
                write_timeout=self.statement_timeout_s + 30,
            )
        except pymysql.err.MySQLError as exc:
            raise DatabaseUnavailable(
                f"cannot connect to MariaDB at {self.address.describe()} as {user!r}: {exc}; "
                "start one with `scripts/mariadb.sh start` or use backend='sqlite'"
            ) from exc

    def admin(self) -> Any:
        """A fresh administrator connection (a context manager that closes it)."""
        return self.connect(self.address.user, self.address.password)

    async def check(self) -> None:
        def ping() -> None:
            with self.admin() as admin, admin.cursor() as cursor:
                cursor.execute("SELECT VERSION()")

        await self.run(ping)

    async def open(self, tables: Sequence[Table]) -> EpisodeDatabase:
        episode = MariaDBEpisode(self.run, self, f"{self._token}_{next(self._numbers)}")

        def create() -> MariaDBEpisode:
            try:
                episode.create(tables)
            except BaseException:
                try:
                    episode._close()
                except Exception:
                    pass
                raise
            return episode

        return await self.run(create)
