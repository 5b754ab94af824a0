"""The benchmark data directory as tasks read it: where it is, verified files, unpacked archives.

The data (AgentBench, ALFWorld and WebShop files; see :mod:`agentrl_ext.env.data_manifest`) is
never part of this project. It lives in one directory, chosen in this order:

1. an explicit path (``--data-dir`` of ``agentrl-data``, a task's ``data_dir`` setting);
2. ``$AGENTRL_DATA_DIR``;
3. ``$XDG_DATA_HOME/agentrl_ext/data``, i.e. ``~/.local/share/agentrl_ext/data``.

Its layout is that of the vendored copy (``agentbench/dbbench/standard.jsonl``, ...), plus a
``SHA256SUMS`` (``sha256sum -c`` format) of what was installed. :func:`require` checks a file
against its pinned checksum before a task reads it; installing and listing are
:mod:`agentrl_ext.data.store` (``agentrl-data``).

Only the standard library is used here: task workers import this module (it is on the
environment side's ground floor, with :mod:`agentrl_ext.env`).
"""

from __future__ import annotations

import fcntl
import hashlib
import lzma
import os
import shutil
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from agentrl_ext.env.data_manifest import ARCHIVES, FILES, DataFile

DATA_DIR_ENV = "AGENTRL_DATA_DIR"
SUMS_FILE = "SHA256SUMS"
_CHUNK = 1 << 20


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/agentrl_ext/data`` (``~/.local/share/agentrl_ext/data``)."""
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "agentrl_ext" / "data"


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The data directory: ``explicit``, else ``$AGENTRL_DATA_DIR``, else :func:`default_data_dir`."""
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    return default_data_dir()


class DataError(Exception):
    """A data file is missing, corrupt or cannot be installed; the message names it and the fix."""


# ---------------------------------------------------------------------------------- checksums


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            yield chunk


def sha256_of(path: Path) -> str:
    """The file's SHA-256 (hex)."""
    digest = hashlib.sha256()
    for chunk in _chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def git_blob_id(size: int, chunks: Iterable[bytes]) -> str:
    """Git's blob id (SHA-1 of ``blob <size>\\0`` + content) of ``size`` bytes of ``chunks``."""
    digest = hashlib.sha1(f"blob {size}\0".encode())
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def read_sums(path: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of a ``sha256sum`` file; DataError naming the bad line."""
    sums: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        digest = parts[0].lower()
        if len(parts) != 2 or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise DataError(f"{path}:{number}: expected '<sha256>  <path>', got {line!r}")
        sums[parts[1].strip().lstrip("*")] = digest
    return sums


def write_sums(root: Path, sums: dict[str, str]) -> None:
    """Write ``root/SHA256SUMS`` (sorted, ``sha256sum -c`` format), atomically."""
    tmp = root / (SUMS_FILE + ".partial")
    tmp.write_text("".join(f"{sums[p]}  {p}\n" for p in sorted(sums)))
    tmp.replace(root / SUMS_FILE)


def check_file(path: Path, entry: DataFile) -> str | None:
    """None when ``path`` holds ``entry``'s pinned content, else what is wrong with it.

    An xz file that is not byte-identical (another liblzma) passes when its decompressed content
    has the upstream checksum; a file pinned by git blob id is checked against that id.
    """
    if not path.is_file():
        return "missing"
    if entry.sha256 is not None:
        actual = sha256_of(path)
        if actual == entry.sha256:
            return None
        if entry.compress_xz and entry.content_sha256 is not None:
            try:
                with lzma.open(path) as handle:
                    content = hashlib.sha256()
                    while chunk := handle.read(_CHUNK):
                        content.update(chunk)
            except lzma.LZMAError as exc:
                return f"not a valid xz file ({exc})"
            if content.hexdigest() == entry.content_sha256:
                return None
        return f"sha256 {actual} != pinned {entry.sha256}"
    if entry.git_blob is not None:
        actual = git_blob_id(path.stat().st_size, _chunks(path))
        return None if actual == entry.git_blob else f"git blob {actual} != pinned {entry.git_blob}"
    return None


def require(relative: str, root: str | os.PathLike[str] | None = None) -> Path:
    """The verified path of data file ``relative`` (e.g. ``agentbench/dbbench/standard.jsonl``).

    Raises DataError naming the file, the data directory and the command that installs it.
    """
    base = data_dir(root)
    path = base / relative
    entry = FILES.get(relative)
    problem = check_file(path, entry) if entry is not None else (None if path.is_file() else "missing")
    if problem is None:
        return path
    how = (
        "agentrl-data fetch"
        if entry is not None and not entry.vendored
        else "agentrl-data install --from <copy of the data> (or agentrl-data fetch)"
    )
    raise DataError(
        f"data file {relative} in {base} is {problem}; install it with `{how}` "
        f"(data dir: --data-dir or ${DATA_DIR_ENV}, default {default_data_dir()})"
    )


# ---------------------------------------------------------------------------------- archives

UNPACKED_STAMP = ".unpacked-sha256"


def unpacked(archive: str, root: str | os.PathLike[str] | None = None) -> Path:
    """The folder that ``archive`` (a key of :data:`ARCHIVES`) unpacks to in the data directory.

    The archive is verified (:func:`require`) and unpacked on first use; the folder's
    ``.unpacked-sha256`` records which archive it holds, so a later call returns at once and a
    changed archive is unpacked again. Unpacking happens in a temporary folder renamed into place,
    under a lock file, so concurrent callers (several workers starting) never see half a folder.
    ``agentrl_ext.data.store.install_from`` unpacks what it installs; a read-only data directory must have been unpacked
    there beforehand (DataError says so).
    """
    if archive not in ARCHIVES:
        raise ValueError(f"{archive!r} is not an archive of the data set; known: {sorted(ARCHIVES)}")
    base = data_dir(root)
    target = base / ARCHIVES[archive]
    digest = FILES[archive].sha256
    if _stamp_of(target) == digest:
        return target
    path = require(archive, root)
    try:
        lock = (base / (archive + ".lock")).open("w")
    except OSError as exc:
        raise DataError(
            f"cannot unpack {archive} into {target}: {exc}; the data directory must be writable once "
            "(run `agentrl-data install --from <copy of the data>`, which unpacks it)"
        ) from exc
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stamp_of(target) == digest:
            return target
        scratch = target.with_name(f".{target.name}.unpacking-{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        try:
            with tarfile.open(path) as tar:
                members = tar.getmembers()
                for member in members:
                    name = Path(member.name)
                    if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
                        raise DataError(f"{path}: unsafe archive member {member.name!r}; nothing unpacked")
                    if name.parts[0] != target.name:
                        raise DataError(f"{path}: member {member.name!r} is outside {target.name}/")
                safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tar.extractall(scratch, members, **safe)  # type: ignore[arg-type]  # members checked above
            if target.exists():
                shutil.rmtree(target)
            (scratch / target.name).rename(target)
            (target / UNPACKED_STAMP).write_text(f"{digest}\n")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def _stamp_of(target: Path) -> str | None:
    stamp = target / UNPACKED_STAMP
    return stamp.read_text().strip() if stamp.is_file() else None
