"""The shared compiler cache: its settings, its probe, the stats log, and builds against a real
redis-server (Debian's package, started here on a free localhost port from a temp folder)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from buildkit import TINY_TARGETS, free_port, closed_url, redis_url, tiny_project  # noqa: F401 - fixtures
from conftest import ROOT, assert_clean_error, run_cli
from polyforge.build import builder as build_lib
from polyforge.build import remote_cache
from polyforge.errors import BadInput


# -- settings ----------------------------------------------------------------------------------
@pytest.mark.parametrize("url, fragment", [
    ("ftp://host", "scheme"),
    ("redis://", "no host"),
    ("redis://host:99999", "out of range"),
    ("redis://host|read-only=true", "'|'"),
    ("redis://host/notadb", "database number"),
    ("http://a b", "spaces"),
])
def test_bad_urls_are_refused(url, fragment):
    with pytest.raises(BadInput, match=fragment):
        remote_cache.parse(url, "here", credentials_allowed=True)


def test_a_password_only_from_the_environment(tmp_path, monkeypatch):
    config = tmp_path / "build.yaml"
    config.write_text("remote_cache:\n  url: redis://:secret@cache:6379\n")
    monkeypatch.delenv(remote_cache.ENV_VAR, raising=False)
    with pytest.raises(BadInput, match="password does not belong in a file"):
        remote_cache.configured(config)
    monkeypatch.setenv(remote_cache.ENV_VAR, "redis://user:secret@cache:6379/2")
    remote = remote_cache.configured(config)
    assert remote.url == "redis://user:secret@cache:6379/2" and remote.origin == f"${remote_cache.ENV_VAR}"
    assert "secret" not in remote.shown and "secret" not in json.dumps(remote.as_dict())
    assert remote.ccache_url().startswith("redis://user:secret@cache:6379/2|connect-timeout=")


def test_settings_come_from_the_variable_then_the_file(tmp_path, monkeypatch):
    config = tmp_path / "build.yaml"
    monkeypatch.delenv(remote_cache.ENV_VAR, raising=False)
    assert remote_cache.configured(config) is None  # no file
    config.write_text("cuda:\n  fa_quants: [q8_0-q8_0]\n")
    assert remote_cache.configured(config) is None  # no section
    config.write_text("remote_cache:\n  url: http://cache:8080/ccache\n")
    assert remote_cache.configured(config).address == ("cache", 8080)
    monkeypatch.setenv(remote_cache.ENV_VAR, "redis://other")
    assert remote_cache.configured(config).address == ("other", 6379)
    monkeypatch.setenv(remote_cache.ENV_VAR, "")
    assert remote_cache.configured(config) is None  # a runner opting out
    monkeypatch.delenv(remote_cache.ENV_VAR)
    for text, fragment in [("remote_cache:\n  url: 5\n", "must be a string"), ("remote_cache:\n  uri: redis://x\n", "unknown key"),
                           ("remote_cache: redis://x\n", "must be a mapping")]:
        config.write_text(text)
        with pytest.raises(BadInput, match=fragment):
            remote_cache.configured(config)


def test_probe_tells_a_redis_from_a_closed_port_and_from_another_server(redis_url, closed_url):
    assert remote_cache.probe(remote_cache.parse(redis_url, "t", credentials_allowed=True)) is None
    assert "cannot reach" in remote_cache.probe(remote_cache.parse(closed_url, "t", credentials_allowed=True))
    # an HTTP URL pointed at the redis: it answers, but not like an HTTP server
    http = redis_url.replace("redis://", "http://")
    assert "does not answer like an HTTP server" in remote_cache.probe(remote_cache.parse(http, "t", credentials_allowed=True))


def test_probe_tells_whether_the_credentials_serve(tmp_path):
    """A redis that wants a password: none, or a wrong one, is a reason; the right one answers."""
    port = free_port()
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", "s3 cr#t"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def why(url):
            return remote_cache.probe(remote_cache.parse(url, "t", credentials_allowed=True))
        deadline = time.monotonic() + 20
        while why(f"redis://127.0.0.1:{port}") is not None and "wants a password" not in why(f"redis://127.0.0.1:{port}"):
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)
        assert "wants a password" in why(f"redis://127.0.0.1:{port}")
        assert "refused" in why(f"redis://:wrong@127.0.0.1:{port}")
        assert why(f"redis://:s3%20cr%23t@127.0.0.1:{port}") is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_stats_log_counts_each_compilation(tmp_path):
    log = tmp_path / "stats.log"
    log.write_text("# a.c\ndirect_cache_hit\nremote_storage_hit\nremote_storage_read_hit\n"
                   "# b.c\ncache_miss\nlocal_storage_miss\nremote_storage_miss\n"
                   "# c.c\npreprocessed_cache_hit\nlocal_storage_hit\n"
                   "# d.c\ncache_miss\nremote_storage_error\n"
                   "# conftest\ncalled_for_link\n")
    stats = remote_cache.read_stats_log(log, remote_cache.parse("redis://h", "t", credentials_allowed=True))
    assert (stats.compilations, stats.remote_hits, stats.local_hits, stats.compiled, stats.remote_errors) == (4, 1, 1, 2, 1)
    assert stats.summary().startswith("1 of 4 compilations from the remote cache")
    assert remote_cache.read_stats_log(tmp_path / "none.log", None).compilations == 0


# -- builds ------------------------------------------------------------------------------------
def test_a_second_clone_takes_every_compilation_from_the_remote(tmp_path, monkeypatch, redis_url):
    monkeypatch.setenv(remote_cache.ENV_VAR, redis_url)
    results = []
    for clone in ("a", "b"):
        monkeypatch.setenv("CCACHE_DIR", str(tmp_path / f"ccache-{clone}"))  # each its own, empty
        proj = tiny_project(tmp_path / clone, monkeypatch)
        results.append(build_lib.build(proj.chain(), build_lib.BuildOptions.make(targets=TINY_TARGETS)))
    first, second = results
    assert first.plan.key == second.plan.key and first.plan.build_dir != second.plan.build_dir
    assert first.cache.compilations == 3 and first.cache.compiled == 3 and first.cache.remote_hits == 0
    assert second.cache.compilations == 3 and second.cache.remote_hits == 3 and second.cache.compiled == 0
    assert second.cache.remote == redis_url and not second.warnings
    assert {a.name: a.sha256 for a in first.manifest.artifacts} == {a.name: a.sha256 for a in second.manifest.artifacts}


def test_a_remote_that_is_down_is_one_warning_and_a_local_build(tmp_path, monkeypatch, closed_url):
    monkeypatch.setenv(remote_cache.ENV_VAR, closed_url)
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache"))
    proj = tiny_project(tmp_path, monkeypatch)
    started = time.monotonic()
    done = run_cli("build", "--target", "llama-cli", "--json", cwd=proj.root)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60
    warnings = [ln for ln in done.stderr.splitlines() if "warning:" in ln]
    assert len(warnings) == 1 and closed_url in warnings[0] and "local cache alone" in warnings[0], done.stderr
    result = json.loads(done.stdout)
    assert result["compiler_cache"]["remote"] is None and result["compiler_cache"]["compilations"] == 3
    assert result["warnings"] == [warnings[0].split("warning:", 1)[1].strip()]


def test_the_build_output_and_plan_say_what_the_remote_gave(tmp_path, monkeypatch, redis_url):
    monkeypatch.setenv(remote_cache.ENV_VAR, redis_url.replace("redis://", "redis://:pw@"))
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache"))
    proj = tiny_project(tmp_path, monkeypatch)
    plan = json.loads(run_cli("build", "--print-plan", "--json", cwd=proj.root).stdout)
    assert plan["remote_cache"]["url"] == redis_url.replace("redis://", "redis://:***@")
    done = run_cli("build", "--target", "ggml", cwd=proj.root)  # this redis wants no password: refused
    assert done.returncode == 0, done.stderr
    assert "warning: remote cache redis://:***@" in done.stderr and "refused" in done.stderr and "pw@" not in done.stderr
    assert "compiler cache: no remote cache; 0 of 1 compilations from the local cache, 1 compiled" in done.stderr
    monkeypatch.setenv(remote_cache.ENV_VAR, redis_url)
    done = run_cli("build", "--target", "llama", cwd=proj.root)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    assert "compiler cache: 0 of 1 compilations from the remote cache, 0 from the local cache, 1 compiled" in done.stderr


def test_a_bad_remote_setting_is_one_error_line(tmp_path, monkeypatch):
    proj = tiny_project(tmp_path, monkeypatch)
    monkeypatch.setenv(remote_cache.ENV_VAR, "ftp://cache")
    assert_clean_error(run_cli("build", "--print-plan", cwd=proj.root), 2, "scheme must be one of")


def _real_project(base: Path) -> Path:
    """This repository's pin, chain and build settings in a folder of their own (a clone)."""
    base.mkdir(parents=True)
    (base / "vendor").mkdir()
    shutil.copy(ROOT / "vendor" / "pin.yaml", base / "vendor" / "pin.yaml")
    shutil.copytree(ROOT / "patches", base / "patches")
    (base / "gates").mkdir()
    shutil.copy(ROOT / "gates" / build_lib.BUILD_CONFIG, base / "gates" / build_lib.BUILD_CONFIG)
    for step in (("vendor", "fetch"), ("apply",)):
        done = run_cli(*step, cwd=base)
        assert done.returncode == 0, done.stderr
    return base


@pytest.mark.slow
def test_real_tree_second_clone_builds_from_the_remote(tmp_path, redis_url):
    """ggml-base of the vendored tree with the chain applied, in two clones at different paths,
    each with an empty local cache: the second compiles nothing."""
    results = []
    for clone in ("a", "clone-b"):
        root = _real_project(tmp_path / clone)
        env = {remote_cache.ENV_VAR: redis_url, "CCACHE_DIR": str(tmp_path / f"ccache-{clone}")}
        done = run_cli("build", "--target", "ggml-base", "-j", "2", "--json", cwd=root, env=env)
        assert done.returncode == 0, done.stderr
        results.append(json.loads(done.stdout))
    first, second = results
    assert first["key"] == second["key"]
    assert first["compiler_cache"]["compiled"] == first["compiler_cache"]["compilations"] > 5
    assert second["compiler_cache"]["remote_hits"] == second["compiler_cache"]["compilations"] == first["compiler_cache"]["compilations"]
    assert second["compiler_cache"]["compiled"] == 0
    assert {a["name"]: a["sha256"] for a in first["artifacts"]} == {a["name"]: a["sha256"] for a in second["artifacts"]}
