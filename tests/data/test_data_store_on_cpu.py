"""agentrl-data: data directory, install from a copy, fetch from (fake) public sources, list, checksums."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import lzma
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl_ext.data.cli import main as agentrl_data
from agentrl_ext.data.fetch import fetch_file
from agentrl_ext.env import data_files
from agentrl_ext.env.data_manifest import FILES, DataFile, Source
from agentrl_ext.testing.vendored_data import vendored_data_dir

SHARED_DATA = vendored_data_dir()
needs_copy = pytest.mark.skipif(
    not (SHARED_DATA / "SHA256SUMS").is_file(), reason=f"no vendored data copy at {SHARED_DATA}"
)


def _json_list(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    capsys.readouterr()
    agentrl_data(["list", "--json", "--data-dir", str(data_dir)])
    return {f["path"]: f["state"] for f in json.loads(capsys.readouterr().out)["files"]}


def test_data_dir_resolution_on_cpu(monkeypatch, tmp_path):
    monkeypatch.delenv(data_files.DATA_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_files.data_dir() == tmp_path / "xdg" / "agentrl_ext" / "data"
    monkeypatch.setenv(data_files.DATA_DIR_ENV, str(tmp_path / "env"))
    assert data_files.data_dir() == tmp_path / "env"
    assert data_files.data_dir(tmp_path / "flag") == tmp_path / "flag"


@needs_copy
def test_install_from_copy_then_list_verifies_on_cpu(tmp_path, capsys):
    target = tmp_path / "data"
    assert agentrl_data(["--data-dir", str(target), "install", "--from", str(SHARED_DATA)]) == 0
    states = _json_list(target, capsys)
    vendored = [p for p, e in FILES.items() if e.vendored]
    assert all(states[p] == "ok" for p in vendored)
    assert states["agentbench/dbbench/db_out_new.jsonl"] == "missing"  # not vendored: fetch only
    assert data_files.read_sums(target / "SHA256SUMS") == data_files.read_sums(SHARED_DATA / "SHA256SUMS")
    assert data_files.require("agentbench/dbbench/standard.jsonl", target).is_file()

    # a file corrupted after the install: list fails and names it; require() refuses it
    dev = target / "agentbench/dbbench/dev.jsonl"
    dev.write_text(dev.read_text() + "\n")
    assert agentrl_data(["list", "--data-dir", str(target)]) == 1
    assert "CORRUPT agentbench/dbbench/dev.jsonl" in capsys.readouterr().out
    with pytest.raises(data_files.DataError, match="agentbench/dbbench/dev.jsonl.*agentrl-data install"):
        data_files.require("agentbench/dbbench/dev.jsonl", target)


def test_install_refuses_a_corrupt_copy_on_cpu(tmp_path, capsys):
    copy = tmp_path / "copy"
    (copy / "a").mkdir(parents=True)
    (copy / "a" / "good.txt").write_text("good")
    (copy / "a" / "bad.txt").write_text("tampered")
    sums = {
        "a/good.txt": hashlib.sha256(b"good").hexdigest(),
        "a/bad.txt": hashlib.sha256(b"bad").hexdigest(),
    }
    data_files.write_sums(copy, sums)
    target = tmp_path / "data"
    assert agentrl_data(["install", "--from", str(copy), "--data-dir", str(target)]) == 1
    err = capsys.readouterr().err
    assert f"{copy / 'a' / 'bad.txt'}: sha256" in err and "good.txt" not in err
    assert not (target / "a").exists()  # nothing installed

    (copy / "SHA256SUMS").unlink()
    assert agentrl_data(["install", "--from", str(copy), "--data-dir", str(target)]) == 1
    assert "has no SHA256SUMS" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- fetch


def _mirror(root: Path, paths: list[str]) -> Path:
    """A raw-file mirror (owner/repo/commit/path) of ``paths``, made from the vendored copy."""
    for path in paths:
        entry = FILES[path]
        assert entry.source is not None
        target = root / entry.source.repo / entry.source.commit / entry.source.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if entry.compress_xz:  # upstream serves the raw JSON
            target.write_bytes(lzma.decompress((SHARED_DATA / path).read_bytes()))
        else:
            shutil.copyfile(SHARED_DATA / path, target)
    return root


class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def do_GET(self) -> None:
        self.requests.append(self.path)
        super().do_GET()

    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@pytest.fixture
def raw_server(tmp_path) -> Iterator[tuple[str, Path, list[str]]]:
    """A plain HTTP file server on 127.0.0.1 over an empty mirror folder: (base URL, folder, request log)."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    requests: list[str] = []
    handler = type("Handler", (_Handler,), {"requests": requests})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(folder))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", folder, requests
    finally:
        server.shutdown()
        server.server_close()


@needs_copy
def test_fetch_from_http_mirror_on_cpu(tmp_path, raw_server, capsys):
    base, folder, requests = raw_server
    groups = ("agentbench", "licenses", "webshop")
    wanted = [p for p, e in FILES.items() if e.group in groups and e.source is not None]
    _mirror(folder, wanted)
    target = tmp_path / "data"
    assert (
        agentrl_data(["fetch", "--only", ",".join(groups), "--raw-base", base, "--data-dir", str(target)])
        == 0
    )
    out = capsys.readouterr().out
    assert f"{len(wanted)} fetched" in out and "2 copy-only" in out  # the two reconstructed WebShop files
    assert "reconstructed from a Lucene index" in out
    states = _json_list(target, capsys)
    assert all(states[p] == "ok" for p in wanted)
    # the xz files were stored compressed and verify against the pinned checksums
    assert (
        data_files.sha256_of(target / "webshop/human_goals.json.xz")
        == FILES["webshop/human_goals.json.xz"].sha256
    )

    # fetching again downloads nothing
    requests.clear()
    assert (
        agentrl_data(["fetch", "--only", ",".join(groups), "--raw-base", base, "--data-dir", str(target)])
        == 0
    )
    assert requests == [] and f"{len(wanted)} already present" in capsys.readouterr().out


@needs_copy
def test_fetch_rejects_corrupt_and_missing_downloads_on_cpu(tmp_path, raw_server, capsys):
    base, folder, _ = raw_server
    _mirror(folder, ["LICENSES/AgentBench-LICENSE.txt", "LICENSES/WebShop-LICENSE.md"])
    served = FILES["LICENSES/WebShop-LICENSE.md"].source
    assert served is not None
    (folder / served.repo / served.commit / served.path).write_text("not the licence")  # corrupt upstream
    target = tmp_path / "data"
    assert agentrl_data(["fetch", "--only", "licenses", "--raw-base", base, "--data-dir", str(target)]) == 1
    err = capsys.readouterr().err
    assert "FAILED LICENSES/WebShop-LICENSE.md" in err and "!= pinned" in err
    assert "FAILED LICENSES/ALFWorld-LICENSE.txt" in err and "404" in err  # not on the mirror
    assert (target / "LICENSES/AgentBench-LICENSE.txt").is_file()
    assert not (target / "LICENSES/WebShop-LICENSE.md").exists()
    assert not list(target.rglob("*.partial"))


def test_fetch_verifies_git_blob_ids_from_file_urls_on_cpu(tmp_path):
    content = b'{"description": "q"}\n' * 3
    mirror = tmp_path / "mirror" / "o" / "r" / "c0"
    mirror.mkdir(parents=True)
    (mirror / "big.jsonl").write_bytes(content)
    blob = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
    entry = DataFile(
        "x/big.jsonl", "test", source=Source("o/r", "c0", "big.jsonl"), git_blob=blob, vendored=False
    )
    root = tmp_path / "data"
    result = fetch_file(entry, root, raw_base=(tmp_path / "mirror").as_uri())
    assert result.outcome == "fetched" and (root / "x/big.jsonl").read_bytes() == content
    assert data_files.check_file(root / "x/big.jsonl", entry) is None

    wrong = DataFile(
        "x/other.jsonl", "test", source=Source("o/r", "c0", "big.jsonl"), git_blob="0" * 40, vendored=False
    )
    result = fetch_file(wrong, root, raw_base=(tmp_path / "mirror").as_uri())
    assert (
        result.outcome == "failed" and "git blob" in result.detail and not (root / "x/other.jsonl").exists()
    )
