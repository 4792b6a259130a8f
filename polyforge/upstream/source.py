"""Source kinds: the places the pinned llama.cpp tree can come from, one class per kind.

A source fills an empty folder with the tree's files; vendor.py then proves that folder is
the pinned tree by its git tree id, whichever kind it came from. A source is written down
in two places: vendor/pin.yaml (a mapping with `name`, `kind` and the kind's keys) and the
command line (`source_from_argument`: a name from the pin, `KIND:WHERE`, or a bare path).

    kind        class      fields                                         on the command line
    pypi-sdist  PypiSdist  package version filename sha256 index subdir   pypi-sdist:NAME==VER[#subdir]
    git         Git        url rev                                        git:URL@REV, or URL.git@REV
    archive     Archive    location sha256 subdir                         archive:PATH_OR_URL[#subdir], or a file
    dir         Dir        location                                       dir:PATH, or a folder

A source spelled on the command line has no pinned sha256: the tree id alone proves it.

To add a kind (say `hg`), in this module:

1. Fields: a frozen dataclass `Hg(SourceKind)` with `kind = "hg"` (the pin's `kind:` and
   the command line's `hg:` prefix), `usage = "hg:URL@REV"` (shown by every spelling
   error), and its own fields, each with a default (the classes are keyword-only).
2. Parse: `from_pin(cls, raw, name, where, commit)` reads the pin's mapping with the
   `schema` readers (need, optional, ...) and `_keys_only`; `commit` is the pin's
   commit, for kinds that fetch a revision. `from_spelling(cls, body, where)` reads what
   follows `hg:`. `spelling` writes it back (`from_spelling` of it gives the same source).
   Every mistake is one BadInput line (exit 2) starting with `where`.
3. Materialize: `materialize(self, cache, dest) -> Path` fills the empty folder `dest`
   with the tree and returns it. Download through `cached_download(cache, ...)` and
   unpack with `extract_archive`. Raise EnvironmentProblem (exit 3) when this machine
   cannot reach the source (fetch then tries the pin's next one), VerificationFailed
   (exit 1) when its bytes are not the pinned ones, BadInput when the source is broken.
4. Register: add the class to SOURCE_KINDS at the bottom. The pin, `--source hg:...`
   and the error messages listing the kinds follow from there.
   `immutable` says whether a spelling always yields the same files; `pin_entry()` writes
   the pin's mapping back (what `polyforge rebase` puts into vendor/pin.yaml).
5. Test: in tests/upstream/test_source.py add its spellings to GOOD_SPELLINGS and BAD_SPELLINGS
   and materialize it from a local fixture; in tests/upstream/test_pin.py add a pin mapping
   to test_each_kind_from_the_pin.
"""

from __future__ import annotations

import abc
import json
import os
import re
import shutil
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Sequence

from polyforge import schema
from polyforge.console import download_progress
from polyforge.errors import BadInput, EnvironmentProblem, VerificationFailed
from polyforge.filelock import FileLock
from polyforge.git import Git as GitRepo, GitFailed
from polyforge.hashing import sha256_bytes, sha256_file

# Never copied out of a source: nested git metadata (the sdist ships a submodule gitlink
# file, packaging debris that breaks git commands inside the tree). Build outputs in a source
# are copied; the snapshot leaves them out (tree_identity.py).
_SKIP_NAMES = {".git"}
_TIMEOUT = 60
PYPI_INDEX = "https://pypi.org/simple"


# -- the kinds ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SourceKind(abc.ABC):
    """One place the tree can come from. `name`: the pin's name for it, or its spelling."""

    kind: ClassVar[str]
    usage: ClassVar[str]
    name: str = ""

    @classmethod
    @abc.abstractmethod
    def from_pin(cls, raw: dict, name: str, where: str, commit: str | None) -> "SourceKind":
        """From the pin's mapping (its `name` and `kind` already read)."""

    @classmethod
    @abc.abstractmethod
    def from_spelling(cls, body: str, where: str) -> "SourceKind":
        """From the command line: `body` is what follows `KIND:`."""

    @property
    @abc.abstractmethod
    def spelling(self) -> str:
        """How to give this source on the command line."""

    @abc.abstractmethod
    def materialize(self, cache: Path, dest: Path) -> Path:
        """Fill the empty folder `dest` with the tree; returns `dest`."""

    @property
    def immutable(self) -> bool:
        """Whether this spelling always yields the same files (a rebase remembers its tree)."""
        return False

    @abc.abstractmethod
    def pin_entry(self) -> dict:
        """The pin's mapping for this source (`name`, `kind`, the kind's keys): what a rebase
        writes into vendor/pin.yaml. May ask the source (an index) for what the spelling lacks."""

    def _entry(self, **keys: str | None) -> dict:
        """A pin mapping: a spelled source is named after its kind; None values are left out."""
        name = self.kind if self.name in ("", self.spelling) else self.name
        return {"name": name, "kind": self.kind, **{k: v for k, v in keys.items() if v is not None}}


@dataclass(frozen=True, kw_only=True)
class PypiSdist(SourceKind):
    """A package's sdist from a PEP 691 index; the tree is `subdir` inside it."""

    kind: ClassVar[str] = "pypi-sdist"
    usage: ClassVar[str] = "pypi-sdist:NAME==VER[#subdir]"
    package: str = ""
    version: str = ""
    filename: str | None = None  # None: the index's sdist of package==version
    sha256: str | None = None  # None: only the index's own record vouches for the bytes
    index: str = PYPI_INDEX
    subdir: str | None = None

    @classmethod
    def from_pin(cls, raw: dict, name: str, where: str, commit: str | None) -> "PypiSdist":
        _keys_only(raw, ("package", "version", "filename", "sha256", "index", "subdir"), where)
        return cls(name=name, package=schema.need(raw, "package", str, where),
                   version=schema.need(raw, "version", str, where),
                   filename=schema.need(raw, "filename", str, where),
                   sha256=schema.hex_digest(schema.need(raw, "sha256", str, where), 64, where, "sha256"),
                   index=schema.optional(raw, "index", str, where, PYPI_INDEX),
                   subdir=_subdir(schema.optional(raw, "subdir", str, where), where))

    @classmethod
    def from_spelling(cls, body: str, where: str) -> "PypiSdist":
        requirement, _, subdir = body.partition("#")
        match = re.fullmatch(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)",
                             requirement)
        if match is None:
            raise BadInput(f"{where}: expected {cls.usage} (a package name, '==', an exact version)")
        return cls(package=match[1], version=match[2], subdir=_subdir(subdir, where))

    @property
    def spelling(self) -> str:
        return f"{self.kind}:{self.package}=={self.version}" + (f"#{self.subdir}" if self.subdir else "")

    def materialize(self, cache: Path, dest: Path) -> Path:
        filename, url, index_sha = self._index_record()
        if self.sha256 and index_sha and index_sha != self.sha256:
            raise VerificationFailed(f"{self.index} lists {filename} with sha256 {index_sha}, the pin says {self.sha256}")
        if self.sha256:
            archive = cached_download(cache, url, filename, self.sha256)
        else:
            archive = cached_download(cache, url, filename, index_sha or None, sha256_from=self.index)
        extract_archive(archive, dest, self.subdir)
        return dest

    @property
    def immutable(self) -> bool:
        return True  # an index never replaces a release's files

    def pin_entry(self) -> dict:
        filename, sha256 = self.filename, self.sha256
        if filename is None or sha256 is None:
            filename, _, index_sha = self._index_record()
            sha256 = sha256 or index_sha or None
        if sha256 is None:
            raise VerificationFailed(f"{self.index} records no sha256 for {filename}: the pin needs one")
        return self._entry(package=self.package, version=self.version, filename=filename, sha256=sha256,
                           subdir=self.subdir, index=self.index)

    def _index_record(self) -> tuple[str, str, str]:
        """(filename, url, sha256) of the sdist, from the index's PEP 691 JSON page."""
        page = f"{self.index.rstrip('/')}/{self.package}/"
        with _http_get(page, "application/vnd.pypi.simple.v1+json") as response:
            try:
                record = json.load(response)
            except ValueError:
                raise EnvironmentProblem(f"{page}: not a PEP 691 JSON index page") from None
        entries = {entry.get("filename"): entry for entry in record.get("files", [])}
        if self.filename is not None:
            wanted = [self.filename]
        else:  # sdists are NAME-VER.tar.gz (older ones .zip), the name spelt as the uploader did
            release = _normalized(f"{self.package}-{self.version}")
            wanted = [f for ext in (".tar.gz", ".zip") for f in entries
                      if isinstance(f, str) and f.endswith(ext) and _normalized(f[: -len(ext)]) == release]
        for filename in wanted:
            if filename in entries:
                entry = entries[filename]
                return filename, urllib.parse.urljoin(page, entry["url"]), entry.get("hashes", {}).get("sha256", "")
        if self.filename is not None:
            raise VerificationFailed(f"{self.filename} is not listed on {page}")
        raise BadInput(f"{page} lists no sdist of {self.package}=={self.version}")


@dataclass(frozen=True, kw_only=True)
class Git(SourceKind):
    """A git repository at a revision; in the pin, the revision is always the pin's commit."""

    kind: ClassVar[str] = "git"
    usage: ClassVar[str] = "git:URL@REV"
    url: str = ""
    rev: str = ""  # a full commit id, or a branch or tag name

    @classmethod
    def from_pin(cls, raw: dict, name: str, where: str, commit: str | None) -> "Git":
        _keys_only(raw, ("location",), where)
        if commit is None:
            raise BadInput(f"{where}: a git source fetches upstream.commit, and the pin has none")
        return cls(name=name, url=schema.need(raw, "location", str, where), rev=commit)

    @classmethod
    def from_spelling(cls, body: str, where: str) -> "Git":
        url, at, rev = body.rpartition("@")
        if not at or not url or ":" in rev:
            raise BadInput(f"{where}: expected {cls.usage} (a repository URL or path, '@', a commit, branch or tag)")
        if url.startswith("-"):  # git would read it as an option
            raise BadInput(f"{where}: {url!r} is not a repository URL or path")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._/+-]*", rev) or ".." in rev:
            raise BadInput(f"{where}: {rev!r} is not a git revision (a commit id, branch or tag)")
        if "://" not in url and not re.match(r"[^/]*:", url):  # a local path: git runs elsewhere
            url = str(Path(url).expanduser().resolve())
        return cls(url=url, rev=rev)

    @property
    def spelling(self) -> str:
        return f"{self.kind}:{os.path.expandvars(self.url)}@{self.rev}"

    @property
    def immutable(self) -> bool:
        return re.fullmatch(r"[0-9a-f]{40}", self.rev) is not None

    def pin_entry(self) -> dict:
        # the pin's git source fetches the pin's commit: upstream.commit must be this rev
        return self._entry(location=self.url)

    def materialize(self, cache: Path, dest: Path) -> Path:
        url = _expanded(self.url, self.name)
        store = cache / "git" / (sha256_bytes(url.encode())[:16] + ".git")
        with FileLock(cache / "git.lock", "git cache", blocking=True):
            if not store.is_dir():
                store.parent.mkdir(parents=True, exist_ok=True)
                GitRepo(store.parent).run("init", "--bare", "-q", str(store))
            bare = GitRepo(store)
            is_commit_id = re.fullmatch(r"[0-9a-f]{40}", self.rev) is not None
            commit = bare.try_rev_parse(f"{self.rev}^{{commit}}") if is_commit_id else None
            if commit is None:  # a branch or tag moves: always asked for again
                try:
                    bare.run("fetch", "-q", "--depth", "1", url, self.rev)
                except GitFailed as exc:
                    raise EnvironmentProblem(f"cannot fetch {self.rev[:12]} from {url}: {exc.message}") from None
                commit = bare.try_rev_parse(f"{self.rev if is_commit_id else 'FETCH_HEAD'}^{{commit}}")
            if commit is None:
                raise VerificationFailed(f"{url} does not have commit {self.rev}")
            dest.mkdir(parents=True, exist_ok=True)
            index = store / "polyforge-export-index"
            exporter = bare.with_index(index)
            try:
                exporter.run("read-tree", commit)
                exporter.run(f"--work-tree={dest}", "checkout-index", "-a", "-f")
            finally:
                index.unlink(missing_ok=True)
        return dest


@dataclass(frozen=True, kw_only=True)
class _AtLocation(SourceKind, abc.ABC):
    """A source found at a `location` that may use ${VAR}: a machine without the variable set
    lacks the source (materialize), while the command line shows it expanded as far as it can."""

    location: str = ""

    def _location_here(self) -> str:
        return _expanded(self.location, self.name)

    @property
    def _spelled_location(self) -> str:
        return f"{self.kind}:{os.path.expandvars(self.location)}"


@dataclass(frozen=True, kw_only=True)
class Archive(_AtLocation):
    """A tar or zip file at a path or URL; the tree is `subdir` inside it (default: its one top folder)."""

    kind: ClassVar[str] = "archive"
    usage: ClassVar[str] = "archive:PATH_OR_URL[#subdir]"
    sha256: str | None = None  # None: the tree id alone proves it
    subdir: str | None = None

    @classmethod
    def from_pin(cls, raw: dict, name: str, where: str, commit: str | None) -> "Archive":
        _keys_only(raw, ("location", "sha256", "subdir"), where)
        return cls(name=name, location=schema.need(raw, "location", str, where),
                   sha256=schema.hex_digest(schema.need(raw, "sha256", str, where), 64, where, "sha256"),
                   subdir=_subdir(schema.optional(raw, "subdir", str, where), where))

    @classmethod
    def from_spelling(cls, body: str, where: str) -> "Archive":
        location, _, subdir = body.partition("#")
        if not location:
            raise BadInput(f"{where}: expected {cls.usage}")
        if urllib.parse.urlsplit(location).scheme not in ("http", "https", "file"):
            path = Path(location).expanduser()
            if not path.is_file():
                raise BadInput(f"{where}: no archive file at {path}")
            location = str(path.resolve())
        return cls(location=location, subdir=_subdir(subdir, where))

    @property
    def spelling(self) -> str:
        return self._spelled_location + (f"#{self.subdir}" if self.subdir else "")

    @property
    def immutable(self) -> bool:
        return self.sha256 is not None

    def pin_entry(self) -> dict:
        sha256 = self.sha256
        if sha256 is None:
            parsed = urllib.parse.urlsplit(self._location_here())
            if parsed.scheme in ("http", "https"):
                raise BadInput(f"{self.spelling}: the pin needs the archive's sha256, and a URL's is not known here")
            sha256 = sha256_file(Path(parsed.path if parsed.scheme == "file" else self._location_here()))
        return self._entry(location=self.location, sha256=sha256, subdir=self.subdir)

    def materialize(self, cache: Path, dest: Path) -> Path:
        location = self._location_here()
        parsed = urllib.parse.urlsplit(location)
        if parsed.scheme in ("http", "https"):
            archive = cached_download(cache, location, PurePosixPath(parsed.path).name, self.sha256)
        else:
            archive = Path(parsed.path if parsed.scheme == "file" else location).expanduser()
            if not archive.is_file():
                raise EnvironmentProblem(f"archive not found: {archive}")
            if self.sha256 is not None:
                actual = sha256_file(archive)
                if actual != self.sha256:
                    raise VerificationFailed(f"{archive}: sha256 {actual} does not match the pin's {self.sha256}")
        extract_archive(archive, dest, self.subdir)
        return dest


@dataclass(frozen=True, kw_only=True)
class Dir(_AtLocation):
    """A local folder holding the tree."""

    kind: ClassVar[str] = "dir"
    usage: ClassVar[str] = "dir:PATH"

    @classmethod
    def from_pin(cls, raw: dict, name: str, where: str, commit: str | None) -> "Dir":
        _keys_only(raw, ("location",), where)
        return cls(name=name, location=schema.need(raw, "location", str, where))

    @classmethod
    def from_spelling(cls, body: str, where: str) -> "Dir":
        path = Path(body).expanduser()
        if not body or not path.is_dir():
            raise BadInput(f"{where}: no folder at {body!r}" if body else f"{where}: expected {cls.usage}")
        return cls(location=str(path.resolve()))

    @property
    def spelling(self) -> str:
        return self._spelled_location

    def pin_entry(self) -> dict:
        return self._entry(location=self.location)

    def materialize(self, cache: Path, dest: Path) -> Path:
        folder = Path(self._location_here()).expanduser()
        if not folder.is_dir():
            raise BadInput(f"source folder not found: {folder}")
        shutil.copytree(folder, dest, ignore=lambda _folder, names: [n for n in names if n in _SKIP_NAMES],
                        symlinks=True, dirs_exist_ok=True)
        return dest


SOURCE_KINDS: dict[str, type[SourceKind]] = {cls.kind: cls for cls in (PypiSdist, Git, Archive, Dir)}


# -- reading sources ------------------------------------------------------------------------
def source_from_pin(raw: Any, where: str, commit: str | None) -> SourceKind:
    """One entry of the pin's `sources` list; `commit` is the pin's upstream commit."""
    schema.mapping(raw, where, "source")
    name = schema.need(raw, "name", str, where)
    kind = schema.need(raw, "kind", str, where)
    where = f"{where} '{name}'"
    if kind not in SOURCE_KINDS:
        raise BadInput(f"{where}: unknown kind '{kind}' (one of {', '.join(SOURCE_KINDS)})")
    return SOURCE_KINDS[kind].from_pin({k: v for k, v in raw.items() if k not in ("name", "kind")}, name, where, commit)


# A bare `URL.git@REV` (https://host/org/repo.git@b1234, git@host:org/repo.git@main)
_GIT_URL_AT_REV = re.compile(r".+\.git@[^@:]+")


def source_from_argument(text: str, pinned: Sequence[SourceKind] = ()) -> SourceKind:
    """A source given on the command line: a name in `pinned`, KIND:WHERE, URL.git@REV, or a
    bare existing path (a folder: dir, a file: archive). A KIND: prefix wins over a path."""
    for source in pinned:
        if source.name == text:
            return source
    prefix, colon, body = text.partition(":")
    path = Path(text).expanduser()
    if colon and prefix in SOURCE_KINDS:
        spelled = SOURCE_KINDS[prefix].from_spelling(body, text)
    elif text and path.is_dir():
        spelled = Dir(location=str(path.resolve()))
    elif text and path.is_file():
        spelled = Archive(location=str(path.resolve()))
    elif _GIT_URL_AT_REV.fullmatch(text):
        spelled = Git.from_spelling(text, text)
    else:
        named = "a source name in the pin, " if pinned else ""
        raise BadInput(f"{text!r}: neither {named}an existing file or folder, nor a source spelled as one of: "
                       + ", ".join(cls.usage for cls in SOURCE_KINDS.values()))
    return replace(spelled, name=spelled.spelling)


def _keys_only(raw: dict, keys: tuple[str, ...], where: str) -> None:
    """A key this kind does not read is a mistake (a misspelt `subdir` would be ignored)."""
    for key in raw:
        if key not in keys:
            raise BadInput(f"{where}: '{key}' is not a key of this kind (its keys: name, kind, {', '.join(keys)})")


def _subdir(value: str | None, where: str) -> str | None:
    """A folder inside an archive: relative, no '..'; None for none."""
    if not value:
        return None
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts:
        raise BadInput(f"{where}: subdir {value!r} must be a relative path inside the archive")
    return str(path)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _expanded(location: str, name: str) -> str:
    """The location with ${VAR} expanded; an unset variable means this machine lacks the source."""
    missing = [v for v in re.findall(r"\$\{(\w+)\}", location) if not os.environ.get(v)]
    if missing:
        raise EnvironmentProblem(f"source '{name}': location {location} names an unset variable")
    return os.path.expandvars(location)


# -- downloads and archives -----------------------------------------------------------------
def _http_get(url: str, accept: str | None = None):
    request = urllib.request.Request(url, headers={"User-Agent": "polyforge", **({"Accept": accept} if accept else {})})
    try:
        return urllib.request.urlopen(request, timeout=_TIMEOUT)
    except urllib.error.HTTPError as exc:
        raise EnvironmentProblem(f"GET {url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EnvironmentProblem(f"cannot reach {urllib.parse.urlsplit(url).netloc or url}: {reason}") from None


def cached_download(cache: Path, url: str, filename: str, sha256: str | None, *, sha256_from: str = "the pin") -> Path:
    """Download once into cache/downloads, verified; a verified cached copy is reused offline."""
    downloads = cache / "downloads"
    folder = downloads / (sha256 or sha256_bytes(url.encode()))
    target = folder / filename
    with FileLock(downloads / ".lock", "download cache", blocking=True):
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
            raise VerificationFailed(f"{filename}: sha256 {actual} does not match {sha256_from}'s {sha256}")
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
