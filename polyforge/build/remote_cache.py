"""The shared compiler cache: ccache's remote storage (its redis and http backends), so that
runners and GPU machines reuse each other's objects instead of each compiling the tree alone.

Where it is set:
  - $POLYFORGE_REMOTE_CACHE, a URL (redis://[[USER]:PASSWORD@]HOST[:PORT], http://HOST[:PORT]/PATH):
    the only place a password may be, since files are committed;
  - else gates/build.yaml `remote_cache.url`, a URL without credentials.
Every build that uses ccache then also reads from and writes to it; the build key does not
change (a cache changes how fast objects come, never which).

A remote that is down or wrong must cost a build nothing but a warning: `probe` tries it once
before the build (one connect, one request, a second at most), and a build whose probe fails
runs with the local cache alone. Past the probe, ccache's own remote errors are not fatal, and
the connect timeout in the URL ccache gets bounds what a remote that dies mid-build costs each
compilation.

What each compilation got is read from ccache's stats log (CCACHE_STATSLOG, one file per build
run): exact for this build, whatever else shares the local cache directory at the same time.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from polyforge import schema
from polyforge.errors import BadInput

ENV_VAR = "POLYFORGE_REMOTE_CACHE"
SCHEMES = {"redis": 6379, "http": 80}
PROBE_SECONDS = 1.0
# ccache's attributes on the URL: a remote that stops answering mid-build costs each compilation
# at most the connect timeout (ms), an answer that stalls at most the operation timeout
CONNECT_TIMEOUT_MS = 200
OPERATION_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class RemoteCache:
    url: str  # as given, credentials included (from the environment only)
    origin: str  # "$POLYFORGE_REMOTE_CACHE" or the file it came from

    @property
    def parts(self) -> urllib.parse.SplitResult:
        return urllib.parse.urlsplit(self.url)

    @property
    def shown(self) -> str:
        """The URL with any password masked: what output and JSON may show."""
        p = self.parts
        if p.password is None:
            return self.url
        user = p.username or ""
        host = p.hostname or ""
        port = f":{p.port}" if p.port else ""
        return urllib.parse.urlunsplit((p.scheme, f"{user}:***@{host}{port}", p.path, p.query, p.fragment))

    @property
    def address(self) -> tuple[str, int]:
        p = self.parts
        return p.hostname or "", p.port or SCHEMES[p.scheme]

    def ccache_url(self) -> str:
        """CCACHE_REMOTE_STORAGE: the URL and the timeouts (space and '|' cannot be in a valid URL)."""
        return f"{self.url}|connect-timeout={CONNECT_TIMEOUT_MS}|operation-timeout={OPERATION_TIMEOUT_MS}"

    def as_dict(self) -> dict:
        return {"url": self.shown, "from": self.origin}


def parse(url: str, origin: str, *, credentials_allowed: bool) -> RemoteCache:
    """A validated remote cache URL; one clear error for any other string."""
    where = f"{origin}: remote cache {url!r}"
    if any(c.isspace() or c == "|" for c in url):
        raise BadInput(f"{where}: a URL has no spaces or '|'")
    try:
        p = urllib.parse.urlsplit(url)
        port = p.port
    except ValueError as exc:
        raise BadInput(f"{where}: {exc}") from None
    if p.scheme not in SCHEMES:
        raise BadInput(f"{where}: the scheme must be one of {', '.join(f'{s}://' for s in SCHEMES)}",
                       hint="ccache's remote storage backends polyforge supports")
    if not p.hostname:
        raise BadInput(f"{where}: no host")
    if port == 0:
        raise BadInput(f"{where}: port 0")
    if p.password is not None and not credentials_allowed:
        raise BadInput(f"{where}: a password does not belong in a file",
                       hint=f"put the URL with its credentials in ${ENV_VAR} instead")
    if p.scheme == "redis" and p.path not in ("", "/") and not p.path.lstrip("/").isdigit():
        raise BadInput(f"{where}: a redis URL's path is a database number")
    return RemoteCache(url, origin)


def configured(config_path: Path | None) -> RemoteCache | None:
    """The remote cache builds use: $POLYFORGE_REMOTE_CACHE, else build.yaml's remote_cache.url
    (config_path None: outside a project, the variable alone), else none. An empty variable means
    none, whatever the file says (a runner opting out)."""
    if ENV_VAR in os.environ:
        value = os.environ[ENV_VAR].strip()
        return parse(value, f"${ENV_VAR}", credentials_allowed=True) if value else None
    if config_path is None:
        return None
    where = str(config_path)
    try:
        top = schema.mapping(schema.load_yaml(config_path) or {}, where)
    except FileNotFoundError:
        return None
    section = schema.optional(top, "remote_cache", dict, where, None)
    if section is None:
        return None
    schema.only(section, ("url",), where, section="remote_cache")
    url = schema.need(section, "url", str, where, section="remote_cache")
    return parse(url.strip(), where, credentials_allowed=False)


def _redis_command(*args: str) -> bytes:
    """One command in redis's wire format (RESP): a password may hold any byte but CR/LF."""
    parts = [a.encode() for a in args]
    return f"*{len(parts)}\r\n".encode() + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in parts)


def probe(remote: RemoteCache, timeout: float = PROBE_SECONDS) -> str | None:
    """None when the remote answers like the server its scheme names and would serve ccache;
    else why not, in words. redis: AUTH with the URL's credentials gets +OK, or without any,
    PING gets +PONG (a redis that wants a password ccache lacks would fail every compilation's
    lookup); http: any HTTP status line."""
    host, port = remote.address
    p = remote.parts
    if p.scheme == "redis":
        credentials = [c for c in (urllib.parse.unquote(p.username or ""), urllib.parse.unquote(p.password or "")) if c]
        request = _redis_command("AUTH", *credentials) if p.password is not None else _redis_command("PING")
    else:
        request = f"HEAD / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode()
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(request)
            answer = conn.recv(256)
    except socket.timeout:
        return f"no answer from {host}:{port} within {timeout:g} s"
    except OSError as exc:
        return f"cannot reach {host}:{port} ({exc.strerror or exc})"
    if p.scheme == "redis":
        if answer.startswith((b"+PONG", b"+OK")):
            return None
        if answer.startswith(b"-NOAUTH"):
            return f"{host}:{port} wants a password (put it in ${ENV_VAR}: redis://:PASSWORD@{host}:{port})"
        if answer.startswith(b"-"):
            first = answer.decode(errors="replace").splitlines()[0][1:]
            return f"{host}:{port} refused: {first}"
        return f"{host}:{port} does not answer like a redis server"
    if answer.startswith(b"HTTP/"):
        return None
    return f"{host}:{port} does not answer like an HTTP server"


# -- what a build got from the cache ---------------------------------------------------------
@dataclass(frozen=True)
class CacheStats:
    """Per compilation ccache saw in one build run (its stats log): where the object came from."""
    compilations: int  # cacheable compilations
    remote_hits: int
    local_hits: int
    compiled: int  # misses: the compiler ran
    remote_errors: int  # remote reads or writes that failed or timed out (ccache went on without)
    remote: str | None  # the remote used (URL shown masked), None: local only

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def summary(self) -> str:
        where = f"{self.remote_hits} of {self.compilations} compilations from the remote cache"
        if self.remote is None:
            where = f"no remote cache; {self.local_hits} of {self.compilations} compilations from the local cache"
        else:
            where += f", {self.local_hits} from the local cache"
        text = f"{where}, {self.compiled} compiled"
        return text + (f"; {self.remote_errors} remote errors" if self.remote_errors else "")


def read_stats_log(path: Path, remote: RemoteCache | None) -> CacheStats:
    """Count ccache's stats log: a '# SOURCE' line, then the counters that one invocation
    incremented, one a line. Calls ccache could not cache (a link, a configure probe) have no
    hit or miss counter and are not compilations."""
    entries: list[set[str]] = []
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        text = ""
    for line in text.splitlines():
        if line.startswith("#"):
            entries.append(set())
        elif entries and line.strip():
            entries[-1].add(line.strip())
    hit = {"direct_cache_hit", "preprocessed_cache_hit"}
    compilations = [e for e in entries if e & hit or "cache_miss" in e]
    return CacheStats(
        compilations=len(compilations),
        remote_hits=sum(1 for e in compilations if "remote_storage_hit" in e),
        local_hits=sum(1 for e in compilations if "local_storage_hit" in e),
        compiled=sum(1 for e in compilations if "cache_miss" in e),
        remote_errors=sum(1 for e in entries if e & {"remote_storage_error", "remote_storage_timeout"}),
        remote=remote.shown if remote else None)
