"""Pin sources: fetch (through a locked download cache) and extract a llama.cpp tree.

Each source kind turns into a plain directory of files; vendor.py then proves that
directory is the pinned tree by its git tree id, whichever source it came from.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

from .console import download_progress
from .errors import BadInput, EnvironmentProblem, VerificationFailed
from .filelock import FileLock
from .git import Git, GitFailed
from .hashing import sha256_file
from .project import cache_dir
from .settings import Pin, Source

# Never copied out of a source: nested git metadata (the sdist ships a submodule gitlink
# file, packaging debris that breaks git commands inside the tree).
_SKIP_NAMES = {".git"}
_TIMEOUT = 60


def downloads_dir() -> Path:
    return cache_dir() / "downloads"


def _http_get(url: str, accept: str | None = None):
    request = urllib.request.Request(url, headers={"User-Agent": "polyforge", **({"Accept": accept} if accept else {})})
    try:
        return urllib.request.urlopen(request, timeout=_TIMEOUT)
    except urllib.error.HTTPError as exc:
        raise EnvironmentProblem(f"GET {url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EnvironmentProblem(f"cannot reach {urllib.parse.urlsplit(url).netloc or url}: {reason}") from None


def pypi_record(source: Source) -> tuple[str, str]:
    """(url, sha256) of the sdist, from the index's PEP 691 JSON page."""
    page = f"{source.index.rstrip('/')}/{source.package}/"
    with _http_get(page, "application/vnd.pypi.simple.v1+json") as response:
        try:
            record = json.load(response)
        except ValueError:
            raise EnvironmentProblem(f"{page}: not a PEP 691 JSON index page") from None
    for entry in record.get("files", []):
        if entry.get("filename") == source.filename:
            return urllib.parse.urljoin(page, entry["url"]), entry.get("hashes", {}).get("sha256", "")
    raise VerificationFailed(f"{source.filename} is not listed on {page}")


def cached_download(url: str, filename: str, sha256: str | None) -> Path:
    """Download once into the cache, verified; a verified cached copy is reused offline."""
    folder = downloads_dir() / (sha256 or hashlib.sha256(url.encode()).hexdigest())
    target = folder / filename
    with FileLock(downloads_dir() / ".lock", "download cache", blocking=True):
        if target.is_file() and (sha256 is None or sha256_file(target) == sha256):
            return target
        folder.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        with _http_get(url) as response, open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with download_progress(filename, total) as advance:
                while block := response.read(1 << 20):
                    out.write(block)
                    advance(len(block))
        actual = sha256_file(partial)
        if sha256 is not None and actual != sha256:
            partial.unlink()
            raise VerificationFailed(f"{filename}: sha256 {actual} does not match the pin's {sha256}")
        partial.replace(target)
        return target


def _safe_member_path(name: str, subdir: str | None) -> PurePosixPath | None:
    """The member's path relative to `subdir`, None when outside it; rejects escapes."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise BadInput(f"archive member escapes the extraction folder: {name}")
    if subdir:
        prefix = PurePosixPath(subdir)
        try:
            path = path.relative_to(prefix)
        except ValueError:
            return None
    if not path.parts or path.parts[0] in _SKIP_NAMES:
        return None
    return path


def _single_top_folder(names: list[str]) -> str | None:
    tops = {PurePosixPath(n).parts[0] for n in names if PurePosixPath(n).parts}
    if len(tops) == 1:
        top = tops.pop()
        if any(len(PurePosixPath(n).parts) > 1 for n in names):
            return top
    return None


def extract_archive(archive: Path, dest: Path, subdir: str | None) -> None:
    """Extract regular files and folders of `subdir` (default: the single top folder)."""
    dest.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = zf.namelist()
            subdir = subdir or _single_top_folder(names)
            for info in zf.infolist():
                rel = _safe_member_path(info.filename, subdir)
                if rel is None or info.is_dir():
                    continue
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                if (info.external_attr >> 16) & 0o111:
                    target.chmod(0o755)
        return
    try:
        tar = tarfile.open(archive)
    except tarfile.TarError as exc:
        raise BadInput(f"{archive}: not a readable tar or zip archive ({exc})") from None
    with tar:
        try:
            members = tar.getmembers()
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise BadInput(f"{archive}: truncated or corrupt archive ({exc})") from None
        subdir = subdir or _single_top_folder([m.name for m in members])
        for member in members:
            rel = _safe_member_path(member.name, subdir)
            if rel is None or member.isdir():
                continue
            if not member.isfile():
                raise BadInput(f"{archive}: member {member.name} is a link or device; trees must be plain files")
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                with tar.extractfile(member) as src, open(target, "wb") as out:  # type: ignore[union-attr]
                    shutil.copyfileobj(src, out)
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise BadInput(f"{archive}: truncated or corrupt archive ({exc})") from None
            target.chmod(0o755 if member.mode & 0o111 else 0o644)


def _copy_dir(src: Path, dest: Path, skip: set[str]) -> None:
    if not src.is_dir():
        raise BadInput(f"source folder not found: {src}")

    def ignore(folder: str, names: list[str]) -> list[str]:
        top = Path(folder) == src
        return [n for n in names if n in _SKIP_NAMES or (top and n in skip)]

    shutil.copytree(src, dest, ignore=ignore, symlinks=True, dirs_exist_ok=True)


def _fetch_git(url: str, commit: str, dest: Path) -> None:
    store = cache_dir() / "git" / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")
    with FileLock(cache_dir() / "git.lock", "git cache", blocking=True):
        if not store.is_dir():
            store.parent.mkdir(parents=True, exist_ok=True)
            Git(store.parent).run("init", "--bare", "-q", str(store))
        bare = Git(store)
        if bare.try_rev_parse(f"{commit}^{{commit}}") is None:
            try:
                bare.run("fetch", "-q", "--depth", "1", url, commit)
            except GitFailed as exc:
                raise EnvironmentProblem(f"cannot fetch {commit[:12]} from {url}: {exc.message}") from None
        if bare.try_rev_parse(f"{commit}^{{commit}}") is None:
            raise VerificationFailed(f"{url} does not have commit {commit}")
        dest.mkdir(parents=True, exist_ok=True)
        index = store / "polyforge-export-index"
        exporter = bare.with_index(index)
        try:
            exporter.run("read-tree", commit)
            exporter.run(f"--work-tree={dest}", "checkout-index", "-a", "-f")
        finally:
            index.unlink(missing_ok=True)


def materialise(source: Source, pin: Pin, dest: Path, skip: set[str]) -> str:
    """Fill `dest` with the tree `source` provides; returns a short description of what was used."""
    if source.kind == "pypi-sdist":
        url, index_sha = pypi_record(source)
        if index_sha and index_sha != source.sha256:
            raise VerificationFailed(
                f"{source.index} lists {source.filename} with sha256 {index_sha}, the pin says {source.sha256}")
        archive = cached_download(url, source.filename or "", source.sha256)
        extract_archive(archive, dest, source.subdir)
        return f"{source.package}=={source.version} sdist ({archive})"
    location = source.resolved_location()
    if location is None:
        raise EnvironmentProblem(f"source '{source.name}': location {source.location} names an unset variable")
    if source.kind == "git":
        _fetch_git(location, pin.commit, dest)
        return f"{location} @ {pin.commit[:12]}"
    if source.kind == "archive":
        parsed = urllib.parse.urlsplit(location)
        if parsed.scheme in ("http", "https"):
            archive = cached_download(location, PurePosixPath(parsed.path).name, source.sha256)
        else:
            archive = Path(parsed.path if parsed.scheme == "file" else location).expanduser()
            if not archive.is_file():
                raise EnvironmentProblem(f"archive not found: {archive}")
            if source.sha256 is not None:
                actual = sha256_file(archive)
                if actual != source.sha256:
                    raise VerificationFailed(f"{archive}: sha256 {actual} does not match the pin's {source.sha256}")
        extract_archive(archive, dest, source.subdir)
        return str(archive)
    _copy_dir(Path(location).expanduser(), dest, skip)
    return location


def adhoc_source(path: Path) -> Source:
    """`--source PATH`: a folder or an archive file, verified by tree id alone."""
    if path.is_dir():
        return Source(name=f"dir:{path}", kind="dir", location=str(path))
    if path.is_file():
        return Source(name=f"archive:{path}", kind="archive", location=str(path))
    raise BadInput(f"--source {path}: neither a source name in the pin nor an existing file or folder")
