"""Source kinds: the pypi-sdist source against a PEP 691 index served on loopback, the download
cache, and every command-line spelling of a source (good and bad)."""

from __future__ import annotations

import hashlib
import http.server
import json
import tarfile
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import ROOT, Proj, assert_clean_error, git_tree_id, run_cli, write_pin
from polyforge.upstream import source
from polyforge.upstream import vendor
from polyforge.errors import BadInput, EnvironmentProblem, VerificationFailed
from polyforge.upstream.source import SOURCE_KINDS, Archive, Dir, Git, PypiSdist, source_from_argument


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
    again = source.cached_download(cache, f"{index.url}/../files/fake_pkg-1.0.tar.gz", "fake_pkg-1.0.tar.gz", sha)
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
    with pytest.raises(BadInput, match="escapes"):
        source.extract_archive(out, tmp_path / "dest", None)
    assert not (tmp_path / "evil.txt").exists()


def test_spelled_pypi_sdist_is_found_and_vouched_for_by_the_index(tmp_path, upstream, cache, index):
    # no filename and no pinned sha256: the index's listing names the sdist and its sha256
    data = _sdist(upstream.path, tmp_path / "sdist.tar.gz")
    sha = hashlib.sha256(data).hexdigest()
    index.files["fake_pkg-1.0.tar.gz"] = data
    index.listed_sha["fake_pkg-1.0.tar.gz"] = sha
    spelled = replace(source_from_argument("pypi-sdist:fake-pkg==1.0#fake_pkg-1.0/vendor/llama.cpp"), index=index.url)
    assert spelled.filename is None and spelled.sha256 is None
    tree = spelled.materialize(cache, tmp_path / "tree")
    assert git_tree_id(tree) == upstream.tree
    assert (cache / "downloads" / sha / "fake_pkg-1.0.tar.gz").read_bytes() == data


def test_spelled_pypi_sdist_checks_the_index_sha256_and_the_version(tmp_path, upstream, cache, index):
    index.files["fake_pkg-1.0.tar.gz"] = _sdist(upstream.path, tmp_path / "sdist.tar.gz")
    index.listed_sha["fake_pkg-1.0.tar.gz"] = "d" * 64  # a lying index or a tampered file
    spelled = replace(source_from_argument("pypi-sdist:fake-pkg==1.0"), index=index.url)
    with pytest.raises(VerificationFailed, match=f"does not match {index.url}'s"):
        spelled.materialize(cache, tmp_path / "tree")
    with pytest.raises(BadInput, match="lists no sdist of fake-pkg==2.0"):
        replace(spelled, version="2.0").materialize(cache, tmp_path / "tree2")


def _git_repo(tmp_path: Path, upstream) -> Path:
    """The upstream tree as a git repository whose one commit is tagged b1."""
    repo = tmp_path / "upstream-git"
    subprocess.run(["cp", "-a", str(upstream.path), str(repo)], check=True)
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A", "-f"], ["git", "commit", "-qm", "up"], ["git", "tag", "b1"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env)
    return repo


def test_fetch_a_spelled_git_source_at_a_tag(proj: Proj, tmp_path):
    repo = _git_repo(tmp_path, proj.upstream)
    result = vendor.fetch(proj.chain(), source=f"git:{repo}@b1")
    assert result.tree == proj.upstream.tree and result.source == f"git:{repo}@b1"


# Placeholders: {dir} a folder, {file} an archive file, both under tmp_path, the working directory.
GOOD_SPELLINGS = [
    ("pypi-sdist:llama-cpp-python==0.3.36", PypiSdist(package="llama-cpp-python", version="0.3.36")),
    ("pypi-sdist:llama_cpp_python==0.3.36#llama_cpp_python-0.3.36/vendor/llama.cpp",
     PypiSdist(package="llama_cpp_python", version="0.3.36", subdir="llama_cpp_python-0.3.36/vendor/llama.cpp")),
    ("git:https://github.com/ggml-org/llama.cpp@b1234", Git(url="https://github.com/ggml-org/llama.cpp", rev="b1234")),
    ("git:{dir}@refs/tags/b1", Git(url="{dir}", rev="refs/tags/b1")),
    ("git:tree@main", Git(url="{dir}", rev="main")),
    ("https://github.com/ggml-org/llama.cpp.git@" + "0" * 40,
     Git(url="https://github.com/ggml-org/llama.cpp.git", rev="0" * 40)),
    ("git@github.com:ggml-org/llama.cpp.git@main", Git(url="git@github.com:ggml-org/llama.cpp.git", rev="main")),
    ("archive:{file}", Archive(location="{file}")),
    ("archive:llama.tar.gz#pkg/vendor/llama.cpp", Archive(location="{file}", subdir="pkg/vendor/llama.cpp")),
    ("archive:https://example.org/llama.tar.gz#llama.cpp",
     Archive(location="https://example.org/llama.tar.gz", subdir="llama.cpp")),
    ("dir:{dir}", Dir(location="{dir}")),
    ("dir:tree", Dir(location="{dir}")),
    ("{dir}", Dir(location="{dir}")),
    ("tree", Dir(location="{dir}")),
    ("llama.tar.gz", Archive(location="{file}")),
]

BAD_SPELLINGS = [
    ("pypi-sdist:llama-cpp-python", "expected pypi-sdist:NAME==VER[#subdir]"),
    ("pypi-sdist:llama-cpp-python>=0.3", "expected pypi-sdist:NAME==VER[#subdir]"),
    ("pypi-sdist:==0.3.36", "expected pypi-sdist:NAME==VER[#subdir]"),
    ("pypi-sdist:x==1.0#../up", "must be a relative path"),
    ("git:https://github.com/ggml-org/llama.cpp", "expected git:URL@REV"),
    ("git:git@github.com:ggml-org/llama.cpp", "expected git:URL@REV"),
    ("git:@main", "expected git:URL@REV"),
    ("git:https://example.org/r@", "is not a git revision"),
    ("git:https://example.org/r@--upload-pack=evil", "is not a git revision"),
    ("git:https://example.org/r@a..b", "is not a git revision"),
    ("git:--upload-pack=evil@main", "is not a repository URL"),
    ("archive:", "expected archive:PATH_OR_URL[#subdir]"),
    ("archive:missing.tar.gz", "no archive file"),
    ("archive:{file}#/etc", "must be a relative path"),
    ("dir:", "expected dir:PATH"),
    ("dir:missing", "no folder"),
    ("dir:{file}", "no folder"),
    ("ftp:tree", "neither an existing file or folder"),
    ("https://example.org/llama.tar.gz", "neither an existing file or folder"),
    ("nope-not-a-source", "neither an existing file or folder"),
    ("", "neither an existing file or folder"),
]


@pytest.fixture
def places(tmp_path, monkeypatch) -> dict[str, str]:
    (tmp_path / "tree").mkdir()
    (tmp_path / "llama.tar.gz").write_bytes(b"not read while parsing")
    monkeypatch.chdir(tmp_path)
    return {"dir": str(tmp_path / "tree"), "file": str(tmp_path / "llama.tar.gz")}


@pytest.mark.parametrize("text, expected", GOOD_SPELLINGS)
def test_good_spellings(places, text, expected):
    got = source_from_argument(text.format(**places))
    filled = {f: getattr(expected, f).format(**places) for f in ("url", "location") if hasattr(expected, f)}
    assert replace(got, name="") == replace(expected, **filled)
    assert got.name == got.spelling  # a spelled source is named by its spelling
    assert source_from_argument(got.spelling) == got  # and the spelling reads back as the same source


@pytest.mark.parametrize("text, fragment", BAD_SPELLINGS)
def test_bad_spellings_are_one_line_bad_input(places, text, fragment):
    with pytest.raises(BadInput) as info:
        source_from_argument(text.format(**places))
    assert info.value.exit_code == 2 and "\n" not in info.value.message
    assert fragment in info.value.message


def test_a_name_in_the_pin_wins_over_a_path(places):
    pinned = Dir(name="tree", location="/elsewhere")
    assert source_from_argument("tree", [pinned]) is pinned
    with pytest.raises(BadInput, match="neither a source name in the pin, an existing file or folder"):
        source_from_argument("nope", [pinned])


def test_every_kind_is_registered_spelled_and_documented():
    readme = (ROOT / "README.md").read_text()
    for name, kind in SOURCE_KINDS.items():
        assert kind.kind == name and kind.usage.startswith(f"{name}:")
        assert f"| `{name}` |" in readme, f"README's source table lacks {name}"


def _tar(folder: Path, out: Path, prefix: str) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        tar.add(folder, arcname=prefix)
    return out


def test_cli_fetch_takes_spelled_sources(proj: Proj, tmp_path):
    archive = _tar(proj.upstream.path, tmp_path / "up.tar.gz", "pkg-1.0/vendor/llama.cpp")
    for spelled in (f"dir:{proj.upstream.path}", f"archive:{archive}#pkg-1.0/vendor/llama.cpp"):
        done = run_cli("vendor", "fetch", "--force", "--json", "--source", spelled, cwd=proj.root)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["source"] == spelled and json.loads(done.stdout)["tree"] == proj.upstream.tree


@pytest.mark.parametrize("spelled, fragment", [
    ("git:https://example.org/r", "--source git:https://example.org/r: expected git:URL@REV"),
    ("pypi-sdist:llama-cpp-python", "expected pypi-sdist:NAME==VER[#subdir]"),
    ("dir:missing", "no folder"),
])
def test_cli_bad_spelling_is_one_line_exit_2(proj: Proj, spelled, fragment):
    assert_clean_error(run_cli("vendor", "fetch", "--source", spelled, cwd=proj.root), 2, fragment)
