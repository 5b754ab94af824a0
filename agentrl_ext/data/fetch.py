"""``agentrl-data fetch``: download the data files from their public sources at pinned commits.

Each file of :data:`agentrl_ext.env.data_manifest.FILES` that has a source is downloaded from
``<raw base>/<owner>/<repo>/<commit>/<path>`` (``https://raw.githubusercontent.com`` unless a
mirror is given; ``file://`` URLs work too), streamed into a ``.partial`` file next to its target,
verified (sha256, upstream content sha256, or git blob id) and only then moved into place. A
file that is already installed and verifies is not downloaded again. Copy-only files are
reported with the reason and skipped.
"""

from __future__ import annotations

import hashlib
import logging
import lzma
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from agentrl_ext.data.store import record_installed
from agentrl_ext.env.data_files import check_file, data_dir, sha256_of
from agentrl_ext.env.data_manifest import FILES, DataFile

logger = logging.getLogger(__name__)

GITHUB_RAW = "https://raw.githubusercontent.com"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FetchResult:
    """What happened to one file: ``fetched``, ``present`` (already verified), ``copy-only`` or ``failed``."""

    path: str
    outcome: str
    detail: str = ""


def _download(url: str, target: Path, timeout_s: float) -> tuple[int, str, str]:
    """Stream ``url`` into ``target``; returns (size, sha256, git blob id) of the bytes."""
    sha256 = hashlib.sha256()
    size = 0
    with urllib.request.urlopen(url, timeout=timeout_s) as response, target.open("wb") as out:
        while chunk := response.read(_CHUNK):
            out.write(chunk)
            sha256.update(chunk)
            size += len(chunk)
    # git's blob id hashes a header with the size first: hash again from the file (cheap).
    blob = hashlib.sha1(f"blob {size}\0".encode())
    with target.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            blob.update(chunk)
    return size, sha256.hexdigest(), blob.hexdigest()


def _verify_download(entry: DataFile, sha256: str, blob: str) -> str | None:
    if entry.git_blob is not None and blob != entry.git_blob:
        return f"git blob {blob} != pinned {entry.git_blob}"
    expected = entry.content_sha256 if entry.compress_xz else entry.sha256
    if expected is not None and sha256 != expected:
        return f"sha256 {sha256} != pinned {expected}"
    return None


def fetch_file(
    entry: DataFile, root: Path, raw_base: str = GITHUB_RAW, attempts: int = 3, timeout_s: float = 60.0
) -> FetchResult:
    """Download, verify and install one file (see the module docstring)."""
    target = root / entry.path
    if entry.source is None:
        return FetchResult(entry.path, "copy-only", entry.copy_only or "no public source")
    if check_file(target, entry) is None:
        return FetchResult(entry.path, "present")
    url = entry.source.url(raw_base)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    error = ""
    for attempt in range(1, attempts + 1):
        try:
            _size, sha256, blob = _download(url, partial, timeout_s)
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            error = f"download of {url} failed: {exc}"
            partial.unlink(missing_ok=True)
            if isinstance(exc, urllib.error.HTTPError) and exc.code == 404:
                break  # a pinned file that is not there will not appear on retry
            if attempt < attempts:
                time.sleep(min(2.0**attempt, 10.0))
            continue
        problem = _verify_download(entry, sha256, blob)
        if problem is not None:
            partial.unlink(missing_ok=True)
            return FetchResult(entry.path, "failed", f"{url}: {problem}; not installed")
        if entry.compress_xz:
            raw = partial.read_bytes()
            partial.write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
        partial.replace(target)
        return FetchResult(entry.path, "fetched", url)
    return FetchResult(entry.path, "failed", error)


def fetch(
    groups: Iterable[str] | None = None,
    root: str | os.PathLike[str] | None = None,
    raw_base: str = GITHUB_RAW,
    workers: int = 8,
) -> list[FetchResult]:
    """Fetch every file of ``groups`` (None: all) into the data directory; returns one result per file."""
    wanted = set(groups) if groups is not None else None
    entries = [e for e in FILES.values() if wanted is None or e.group in wanted]
    base = data_dir(root)
    base.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda e: fetch_file(e, base, raw_base), entries))
    installed = {r.path: sha256_of(base / r.path) for r in results if r.outcome in ("fetched", "present")}
    record_installed(base, installed)
    for result in results:
        if result.outcome == "failed":
            logger.error("%s: %s", result.path, result.detail)
    return results
