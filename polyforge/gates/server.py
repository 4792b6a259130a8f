"""server: start llama-server on loopback (a free port) with the gate's flags, wait for
/health, send the requests, extract JSON fields as metrics; the server is always stopped.

params: model (required), flags (extra arguments), health_timeout (s, default 120),
requests: list of {name, method (GET|POST), path, body (JSON), extract {metric: json.path}}.
metrics: one mapping per request name: status (HTTP), ms, and the extracted fields
(a path that is absent yields no metric, which fails any threshold reading it).

LlamaServer is the one llama-server harness: this kind and the gate programs
(gates/*/gate_*.py) start, wait for and stop servers through it.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, NoReturn

from .. import proc, schema
from ..errors import BadInput, VerificationFailed
from ._common import need_model

_PATH = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")


def validate_params(params: dict, where: str, models: tuple[str, ...]) -> dict:
    schema.only(params, {"model", "flags", "health_timeout", "requests"}, where, section="params")
    model = need_model(params, where, models)
    requests = schema.need(params, "requests", list, where, section="params")
    if not requests:
        raise BadInput(f"{where}: 'params.requests' must be a non-empty list")
    parsed = []
    for i, req in enumerate(requests):
        section = f"params.requests[{i}]"
        schema.mapping(req, where, section)
        schema.only(req, {"name", "method", "path", "body", "extract"}, where, section=section)
        name = schema.need(req, "name", str, where, section=section)
        method = schema.optional(req, "method", str, where, "GET", section=section).upper()
        if method not in ("GET", "POST"):
            raise BadInput(f"{where}: '{section}.method' must be GET or POST")
        path = schema.need(req, "path", str, where, section=section)
        if not path.startswith("/"):
            raise BadInput(f"{where}: '{section}.path' must start with /")
        extract = schema.str_map(req, "extract", where, section=section)
        for metric, json_path in extract.items():
            if not _PATH.match(json_path):
                raise BadInput(f"{where}: '{section}.extract.{metric}': {json_path!r} is not a dotted JSON path")
        parsed.append({"name": name, "method": method, "path": path, "body": req.get("body"), "extract": extract})
    if len({r["name"] for r in parsed}) != len(parsed):
        raise BadInput(f"{where}: request names repeat")
    health = schema.optional(params, "health_timeout", (int, float), where, 120, section="params")
    return {"model": model, "flags": schema.str_list(params, "flags", where, section="params", numbers_as_text=True),
            "health_timeout": float(health), "requests": parsed}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def json_path(data, path: str):
    """'choices.0.message.content' into nested JSON; raises KeyError when absent."""
    node = data
    for part in path.split("."):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise KeyError(path)
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(path)
    return node


def request(base: str, method: str, path: str, body, timeout: float) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class LlamaServer:
    """llama-server on loopback at a free port, its output in log_path: the one harness of the
    server kind and of the gate programs (gates/*/gate_*.py). As a context manager it starts
    the server and stops its whole process group on exit, also on errors."""

    def __init__(self, binary, model, flags, log_path: Path, env: dict | None = None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                     *[str(f) for f in flags]]
        self.process = proc.Background(self.argv, log_path=self.log_path, env=env)

    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.process.__enter__()

    def stop(self) -> None:
        self.process.stop()

    def alive(self) -> bool:
        return self.process.exit_status() is None

    def wait_exit(self, timeout: float) -> int | None:
        """The exit status of a server expected to refuse its input; None if it still runs."""
        return self.process.wait(timeout)

    def wait_healthy(self, timeout: float) -> float:
        """Seconds until /health answered 200; VerificationFailed (with the log's last line)
        if the server exits first or timeout passes."""
        started = time.monotonic()
        while True:
            status = self.process.exit_status()
            if status is not None:
                raise VerificationFailed(f"llama-server exited with status {status} before it became healthy "
                                         f"(log: {self.log_path}){self._last_log_line()}")
            try:
                code, _ = request(self.base, "GET", "/health", None, timeout=2)
                if code == 200:
                    return time.monotonic() - started
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() - started > timeout:
                raise VerificationFailed(f"llama-server did not become healthy within {timeout:.0f} s "
                                         f"(log: {self.log_path}){self._last_log_line()}")
            time.sleep(0.25)

    def get(self, path: str, timeout: float = 60):
        """(HTTP status, the body as JSON, or as text when it is not JSON: /metrics)."""
        return self._call("GET", path, None, timeout)

    def post_json(self, path: str, body, timeout: float = 600):
        """(HTTP status, the body as JSON, or as text when it is not JSON)."""
        return self._call("POST", path, body, timeout)

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        status, reply = self.post_json("/tokenize", {"content": text, "add_special": add_special,
                                                     "parse_special": True})
        if status != 200:
            raise VerificationFailed(f"/tokenize returned {status}: {reply}")
        return reply["tokens"]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def _last_log_line(self) -> str:
        lines = [line.strip() for line in self.log_text().splitlines() if line.strip()]
        return f": {lines[-1][:300]}" if lines else ""

    def _call(self, method: str, path: str, body, timeout: float):
        status, raw = request(self.base, method, path, body, timeout)
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text


def run(ctx) -> dict:
    p = ctx.gate.params
    log = ctx.work_dir / "llama-server.log"
    server = LlamaServer(ctx.bin("llama-server"), ctx.model(p["model"]), [ctx.substitute(f) for f in p["flags"]],
                         log, env=ctx.env)
    metrics: dict = {}
    ctx.log(f"starting llama-server on {server.base}")
    with server:
        try:
            metrics["health"] = {"seconds": round(server.wait_healthy(p["health_timeout"]), 2)}
        except VerificationFailed:
            ctx.note_failure("llama-server did not start", server.log_text())
            raise
        for req in p["requests"]:
            started = time.monotonic()
            try:
                status, raw = request(server.base, req["method"], req["path"], req["body"], timeout=ctx.gate.timeout)
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
                raise VerificationFailed(f"request {req['name']} ({req['method']} {req['path']}) failed: {exc} "
                                         f"(log: {log})") from None
            row = {"status": status, "ms": round((time.monotonic() - started) * 1000, 1)}
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = None
            for metric, path in req["extract"].items():
                try:
                    row[metric] = json_path(payload, path)
                except KeyError:
                    pass
            metrics[req["name"]] = row
            ctx.log(f"{req['name']}: HTTP {status} in {row['ms']} ms")
    return metrics


# -- what the gate programs share besides the server ------------------------------------------
# They run as files (`python gates/mtp/gate_mtp.py ...`, the command kind) and print one
# verdict JSON line on stdout; their progress goes to stderr.
_PROGRAM_STARTED = time.monotonic()


def program_log(*parts) -> None:
    print(f"[gate {time.monotonic() - _PROGRAM_STARTED:6.1f}s]", *parts, file=sys.stderr, flush=True)


def run_program(check: Callable[[], dict], as_json: bool) -> NoReturn:
    """Run a gate program with SIGTERM turned into a normal exit (so the servers its `with`
    blocks hold are stopped), print its verdict (one compact line with as_json) and exit 0
    only when ok."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    verdict = check()
    print(json.dumps(verdict, separators=(",", ":")) if as_json else json.dumps(verdict, indent=2))
    sys.exit(0 if verdict["ok"] else 1)
