"""A llama-server process for the gate scripts: start on a free local port, wait for /health,
JSON requests, stop the whole process group; and how a gate script runs and reports. Stdlib only,
shared by the scripts in this folder (run as scripts from here, so a plain import finds it)."""

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

T0 = time.time()


def log(*a):
    print(f"[gate {time.time() - T0:6.1f}s]", *a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gate_main(run_gate, args):
    """Run a gate with SIGTERM turned into a normal exit (so servers stop in finally blocks), print
    its verdict (one compact line with --json) and exit 0 only when ok."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    verdict = run_gate(args)
    print(json.dumps(verdict, separators=(",", ":")) if args.json else json.dumps(verdict, indent=2))
    sys.exit(0 if verdict["ok"] else 1)


class Server:
    def __init__(self, binary, model, args, log_dir, name):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(self.port)] + list(args)
        log(f"start {name}: {' '.join(shlex.quote(c) for c in self.cmd)}")
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, timeout):
        t_end = time.time() + timeout
        while time.time() < t_end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}, see {self.log_path}")
            try:
                st, _ = self.get("/health", timeout=2)
                if st == 200:
                    return
            except Exception:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} not healthy after {timeout}s, see {self.log_path}")

    def wait_exit(self, timeout):
        """Exit code of a server expected to refuse its input, or None if it is still running."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=15)
        self.log_file.close()

    def alive(self):
        return self.proc.poll() is None

    def _req(self, method, path, body=None, timeout=600):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read().decode()
                status = r.status
        except urllib.error.HTTPError as e:
            raw = e.read().decode()
            status = e.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw

    def get(self, path, timeout=60):
        return self._req("GET", path, timeout=timeout)

    def post(self, path, body, timeout=600):
        return self._req("POST", path, body, timeout=timeout)

    def log_text(self):
        self.log_file.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def tokenize(self, text, add_special):
        st, r = self.post("/tokenize", {"content": text, "add_special": add_special, "parse_special": True})
        assert st == 200, r
        return r["tokens"]
