"""Property: any text edits, captured as a chain, unapply to the baseline and re-apply to the
same bytes and modes, and verify-patches proves it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import fetched_project, make_upstream
from polyforge.chain import verify

FILES = ["README.md", "src/llama.cpp", "src/llama.h", "ggml/src/ggml.c", "docs/build.md"]
line_text = st.text(alphabet=st.sampled_from("abc xyz{}();\t#"), min_size=0, max_size=12)
edit = st.one_of(
    st.tuples(st.just("replace"), st.sampled_from(FILES), st.integers(0, 200), line_text),
    st.tuples(st.just("insert"), st.sampled_from(FILES), st.integers(0, 200), line_text),
    st.tuples(st.just("delete-line"), st.sampled_from(FILES), st.integers(0, 200), st.just("")),
    st.tuples(st.just("new-file"), st.sampled_from(["src/n1.c", "tools/n2.py", "n3.txt"]), st.integers(0, 3), line_text),
    st.tuples(st.just("remove-file"), st.sampled_from(FILES + ["src/n1.c"]), st.just(0), st.just("")),
    st.tuples(st.just("chmod"), st.sampled_from(FILES + ["n3.txt"]), st.just(0), st.just("")),
)


def _do(tree: Path, op: str, rel: str, at: int, text: str) -> None:
    path = tree / rel
    if op == "new-file":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((text + "\n") * (at + 1))
        return
    if not path.exists():
        return
    if op == "remove-file":
        path.unlink()
        return
    if op == "chmod":
        path.chmod(path.stat().st_mode ^ 0o111)
        return
    lines = path.read_text().split("\n")
    i = at % len(lines)
    if op == "replace":
        lines[i] = text
    elif op == "insert":
        lines.insert(i, text)
    elif op == "delete-line" and len(lines) > 1:
        del lines[i]
    path.write_text("\n".join(lines))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(edit, min_size=1, max_size=6), min_size=1, max_size=3))
def test_capture_unapply_apply_verify(batches, cache):
    base = Path(tempfile.mkdtemp(prefix="pf-prop-"))
    try:
        proj = fetched_project(base / "project", make_upstream(base))
        chain = proj.chain()
        captured = 0
        for number, batch in enumerate(batches, 1):
            for op in batch:
                _do(proj.tree, *op)
            if chain.live_changes():
                chain.capture(f"{number:04d}-batch")
                captured += 1
        live = chain.tree.snapshot()
        assert len(chain.unapply()) == captured
        assert chain.tree.snapshot() == proj.upstream.tree
        chain.apply()
        assert chain.tree.snapshot() == live
        proof = verify.verify(chain)
        assert proof.ok, proof.as_dict()
    finally:
        shutil.rmtree(base, ignore_errors=True)
