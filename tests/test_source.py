"""The pypi-sdist source against a PEP 691 index served on loopback, and the download cache."""

from __future__ import annotations

import hashlib
import http.server
import json
import tarfile
import threading
from pathlib import Path

import pytest

from conftest import Proj, write_pin
from polyforge import source, vendor
from polyforge.errors import EnvironmentProblem, VerificationFailed


class _Index:
    def __init__(self, root: Path):
        self.root = root
        self.hits: list[str] = []
        self.files: dict[str, bytes] = {}
        self.listed_sha: dict[str, str] = {}
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                index.hits.append(self.path)
                if self.path == "/simple/fake-pkg/":
                    body = json.dumps({"meta": {"api-version": "1.0"}, "files": [
                        {"filename": name, "url": f"/files/{name}", "hashes": {"sha256": index.listed_sha[name]}}
                        for name in index.files]}).encode()
                    ctype = "application/vnd.pypi.simple.v1+json"
                elif self.path.startswith("/files/") and self.path[7:] in index.files:
                    body, ctype = index.files[self.path[7:]], "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index(tmp_path):
    served = _Index(tmp_path)
    yield served
    served.close()


def _sdist(upstream_path: Path, out: Path) -> bytes:
    with tarfile.open(out, "w:gz") as tar:
        tar.add(upstream_path, arcname="fake_pkg-1.0/vendor/llama.cpp")
    return out.read_bytes()


def _pin_pypi(root: Path, upstream, index_url: str, sha: str, extra: list[dict] | None = None):
    write_pin(root, upstream, [{"name": "pypi-sdist", "kind": "pypi-sdist", "package": "fake-pkg", "version": "1.0",
                                "filename": "fake_pkg-1.0.tar.gz", "sha256": sha, "index": index_url,
                                "subdir": "fake_pkg-1.0/vendor/llama.cpp"}] + (extra or []))


def test_pypi_sdist_fetch_and_cache(tmp_path, upstream, cache, index, monkeypatch):
    data = _sdist(upstream.path, tmp_path / "sdist.tar.gz")
    sha = hashlib.sha256(data).hexdigest()
    index.files["fake_pkg-1.0.tar.gz"] = data
    index.listed_sha["fake_pkg-1.0.tar.gz"] = sha
    root = tmp_path / "p"
    _pin_pypi(root, upstream, index.url, sha)
    monkeypatch.chdir(root)
    result = vendor.fetch(Proj(root, upstream).chain())
    assert result.source == "pypi-sdist" and result.tree == upstream.tree
    assert (cache / "downloads" / sha / "fake_pkg-1.0.tar.gz").read_bytes() == data
    downloads = [h for h in index.hits if h.startswith("/files/")]
    assert len(downloads) == 1
    # a second download of the same file is served from the verified cache
    again = source.cached_download(f"{index.url}/../files/fake_pkg-1.0.tar.gz", "fake_pkg-1.0.tar.gz", sha)
    assert again.read_bytes() == data and len([h for h in index.hits if h.startswith("/files/")]) == 1


def test_index_record_disagrees_with_pin(tmp_path, upstream, cache, index, monkeypatch):
    data = _sdist(upstream.path, tmp_path / "sdist.tar.gz")
    index.files["fake_pkg-1.0.tar.gz"] = data
    index.listed_sha["fake_pkg-1.0.tar.gz"] = "e" * 64
    root = tmp_path / "p"
    _pin_pypi(root, upstream, index.url, hashlib.sha256(data).hexdigest())
    monkeypatch.chdir(root)
    with pytest.raises(VerificationFailed, match="the pin says"):
        vendor.fetch(Proj(root, upstream).chain())


def test_downloaded_bytes_disagree_with_pin(tmp_path, upstream, cache, index, monkeypatch):
    data = _sdist(upstream.path, tmp_path / "sdist.tar.gz")
    pinned = "d" * 64
    index.files["fake_pkg-1.0.tar.gz"] = data
    index.listed_sha["fake_pkg-1.0.tar.gz"] = pinned  # a lying index or a tampered file
    root = tmp_path / "p"
    _pin_pypi(root, upstream, index.url, pinned)
    monkeypatch.chdir(root)
    with pytest.raises(VerificationFailed, match="does not match the pin"):
        vendor.fetch(Proj(root, upstream).chain())
    assert not list((cache / "downloads").rglob("*.tar.gz")), "a bad download is not cached"


def test_offline_index_falls_through_to_next_source(tmp_path, upstream, cache, monkeypatch):
    root = tmp_path / "p"
    _pin_pypi(root, upstream, "http://127.0.0.1:9/simple", "a" * 64,
              extra=[{"name": "local", "kind": "dir", "location": str(upstream.path)}])
    monkeypatch.chdir(root)
    result = vendor.fetch(Proj(root, upstream).chain())
    assert result.source == "local"
    assert result.skipped and "cannot reach" in result.skipped[0]


def test_offline_only_source_is_exit_3(tmp_path, upstream, cache, monkeypatch):
    root = tmp_path / "p"
    _pin_pypi(root, upstream, "http://127.0.0.1:9/simple", "a" * 64)
    monkeypatch.chdir(root)
    with pytest.raises(EnvironmentProblem) as info:
        vendor.fetch(Proj(root, upstream).chain())
    assert info.value.exit_code == 3


def test_archive_member_escaping_is_refused(tmp_path):
    import io
    out = tmp_path / "evil.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        info = tarfile.TarInfo("top/../../evil.txt")
        payload = b"x"
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    from polyforge.errors import BadInput
    with pytest.raises(BadInput, match="escapes"):
        source.extract_archive(out, tmp_path / "dest", None)
    assert not (tmp_path / "evil.txt").exists()
