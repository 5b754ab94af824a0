"""Installing and listing the benchmark data (``agentrl-data``): the set-up side of
:mod:`agentrl_ext.env.data_files`, which is what tasks read.

Every install is verified: :func:`install_from` checks each file of the copy against the copy's
``SHA256SUMS`` before copying anything.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from agentrl_ext.env.data_files import (
    SUMS_FILE,
    DataError,
    check_file,
    data_dir,
    read_sums,
    sha256_of,
    unpacked,
    write_sums,
)
from agentrl_ext.env.data_manifest import ARCHIVES, FILES, DataFile

# ---------------------------------------------------------------------------------- listing


@dataclass(frozen=True)
class FileStatus:
    """One known file's state in a data directory: ``ok``, ``missing`` or a problem."""

    entry: DataFile
    problem: str | None

    @property
    def state(self) -> str:
        """``ok``, ``missing`` or ``corrupt``."""
        if self.problem is None:
            return "ok"
        return "missing" if self.problem == "missing" else "corrupt"


def file_statuses(root: str | os.PathLike[str] | None = None) -> list[FileStatus]:
    """Every known file's state in the data directory, verified against the pinned checksums."""
    base = data_dir(root)
    return [FileStatus(entry, check_file(base / path, entry)) for path, entry in sorted(FILES.items())]


# ---------------------------------------------------------------------------------- install


def _copy_atomic(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".partial")
    shutil.copyfile(source, tmp)
    tmp.replace(target)


def install_from(copy: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> list[str]:
    """Install the data from a local copy (a folder laid out like the vendored data).

    Every file the copy's ``SHA256SUMS`` lists is checked first; if any is missing or corrupt,
    nothing is installed and DataError names each bad file. Files pinned by git blob id
    (``agentbench/dbbench/db_out_new.jsonl``) are installed too when the copy has them and they
    check out. Returns the installed paths (relative).
    """
    source = Path(copy).expanduser()
    sums_path = source / SUMS_FILE
    if not sums_path.is_file():
        raise DataError(f"{source} has no {SUMS_FILE}; a data copy lists its files' sha256 there")
    sums = read_sums(sums_path)
    bad = []
    for relative, digest in sorted(sums.items()):
        path = source / relative
        if not path.is_file():
            bad.append(f"{path}: missing")
        elif (actual := sha256_of(path)) != digest:
            bad.append(f"{path}: sha256 {actual} != {digest} listed in {sums_path}")
    extras = {}
    for relative, entry in FILES.items():
        if not entry.vendored and (source / relative).is_file():
            problem = check_file(source / relative, entry)
            if problem is not None:
                bad.append(f"{source / relative}: {problem}")
            else:
                extras[relative] = sha256_of(source / relative)
    if bad:
        raise DataError("corrupt data copy, nothing installed:\n  " + "\n  ".join(bad))
    base = data_dir(root)
    base.mkdir(parents=True, exist_ok=True)
    installed = {**sums, **extras}
    for relative in sorted(installed):
        _copy_atomic(source / relative, base / relative)
    if (source / "README.md").is_file():
        _copy_atomic(source / "README.md", base / "README.md")
    previous = read_sums(base / SUMS_FILE) if (base / SUMS_FILE).is_file() else {}
    write_sums(base, {**previous, **installed})
    for archive in sorted(ARCHIVES.keys() & installed.keys()):
        unpacked(archive, base)
    return sorted(installed)


def record_installed(root: Path, sums: dict[str, str]) -> None:
    """Add ``sums`` to the data directory's ``SHA256SUMS`` (used by ``fetch``)."""
    previous = read_sums(root / SUMS_FILE) if (root / SUMS_FILE).is_file() else {}
    write_sums(root, {**previous, **sums})
