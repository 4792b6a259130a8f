"""server: start llama-server on loopback (a free port) with the gate's flags, wait for
/health, send the requests, extract JSON fields as metrics; the server is always stopped.

params: model (required), flags (extra arguments), health_timeout (s, default 120),
requests: list of {name, method (GET|POST), path, body (JSON), extract {metric: json.path}}.
metrics: one mapping per request name: status (HTTP), ms, and the extracted fields
(a path that is absent yields no metric, which fails any threshold reading it).
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request

from .. import proc
from ..errors import BadInput, VerificationFailed
from ._common import need, need_model, only, str_list

_PATH = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")


def validate(params: dict, where: str, models: tuple[str, ...]) -> dict:
    only(params, {"model", "flags", "health_timeout", "requests"}, where)
    model = need_model(params, where, models)
    requests = params.get("requests")
    if not isinstance(requests, list) or not requests:
        raise BadInput(f"{where}: params.requests must be a non-empty list")
    parsed = []
    for i, req in enumerate(requests):
        w = f"{where}: requests[{i}]"
        if not isinstance(req, dict):
            raise BadInput(f"{w}: must be a mapping")
        only(req, {"name", "method", "path", "body", "extract"}, w)
        name = need(req, "name", str, w, required=True)
        method = need(req, "method", str, w, "GET").upper()
        if method not in ("GET", "POST"):
            raise BadInput(f"{w}: method must be GET or POST")
        path = need(req, "path", str, w, required=True)
        if not path.startswith("/"):
            raise BadInput(f"{w}: path must start with /")
        extract = need(req, "extract", dict, w, {})
        for metric, json_path in extract.items():
            if not isinstance(json_path, str) or not _PATH.match(json_path):
                raise BadInput(f"{w}: extract.{metric}: {json_path!r} is not a dotted JSON path")
        parsed.append({"name": name, "method": method, "path": path, "body": req.get("body"), "extract": extract})
    if len({r["name"] for r in parsed}) != len(parsed):
        raise BadInput(f"{where}: request names repeat")
    health = need(params, "health_timeout", (int, float), where, 120)
    return {"model": model, "flags": str_list(params, "flags", where), "health_timeout": float(health),
            "requests": parsed}


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


def wait_healthy(server: proc.Background, base: str, timeout: float, log_path) -> float:
    started = time.monotonic()
    while True:
        status = server.exit_status()
        if status is not None:
            raise VerificationFailed(f"llama-server exited with status {status} before it became healthy (log: {log_path})")
        try:
            code, _ = request(base, "GET", "/health", None, timeout=2)
            if code == 200:
                return time.monotonic() - started
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() - started > timeout:
            raise VerificationFailed(f"llama-server did not become healthy within {timeout:.0f} s (log: {log_path})")
        time.sleep(0.25)


def run(ctx) -> dict:
    p = ctx.gate.params
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [ctx.bin("llama-server"), "-m", ctx.model(p["model"]), "--host", "127.0.0.1", "--port", str(port),
            *[ctx.substitute(f) for f in p["flags"]]]
    log = ctx.work_dir / "llama-server.log"
    metrics: dict = {}
    ctx.log(f"starting llama-server on {base}")
    with proc.Background(argv, log_path=log, env=ctx.env) as server:
        try:
            metrics["health"] = {"seconds": round(wait_healthy(server, base, p["health_timeout"], log), 2)}
        except VerificationFailed:
            ctx.note_failure("llama-server did not start", log.read_text(errors="replace") if log.is_file() else "")
            raise
        for req in p["requests"]:
            started = time.monotonic()
            try:
                status, raw = request(base, req["method"], req["path"], req["body"], timeout=ctx.gate.timeout)
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
