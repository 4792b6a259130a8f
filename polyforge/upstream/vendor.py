"""Fetching the pinned baseline into the vendored repository (vendored_tree.py), and packing it.

The library of `polyforge vendor` (fetch, status, pack); where a source's files come from
is source.py. fetch: fill a fresh folder beside vendor/llama.cpp from a source, prove its
tree id against the pin (the full tree) or chain.lock (the pruned baseline the chain needs,
which keeps the files the chain touches inside the pin's pack.prune folders), make it the
vendored repository, and only then swap it in. An existing tree with live edits is never
overwritten: --force moves it into vendor/backups/ and says where.

What the chain decides (its pruned baseline, a patched pack, what a pruned pack keeps) comes
from the Workspace's questions, which the chain answers (workspace.py).
"""

from __future__ import annotations

import lzma
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from polyforge.errors import BadInput, EnvironmentProblem, PolyforgeError, VerificationFailed
from polyforge.filelock import FileLock
from polyforge.git import prune_tree
from polyforge.hashing import sha256_file
from polyforge.project import cache_dir
from polyforge.upstream.source import source_from_argument
from polyforge.upstream.vendored_tree import VendoredTree
from polyforge.upstream.workspace import Workspace


@dataclass
class FetchResult:
    source: str
    detail: str
    tree: str
    pruned: bool
    seconds: float
    skipped: list[str]
    backup: str | None = None
    already: bool = False

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _incoming(project_vendor: Path) -> Path:
    path = project_vendor / f".incoming-{int(time.time() * 1000)}"
    path.mkdir(parents=True)
    return path


def fetch(ws: Workspace, source: str | None = None, force: bool = False) -> FetchResult:
    started = time.monotonic()
    project, pin, tree = ws.project, ws.pin, ws.tree
    if source is None:
        candidates = list(pin.sources)
    else:
        try:
            candidates = [source_from_argument(source, pin.sources)]
        except BadInput as exc:
            raise BadInput(f"--source {exc.message}") from None
    pack_base = ws.pack_base()
    if tree.exists() and not force:
        base = tree.baseline_tree()
        if base in (pin.tree, pack_base):
            return FetchResult("existing", str(tree.path), base, base != pin.tree,
                               time.monotonic() - started, [], already=True)
        raise VerificationFailed(f"the vendored baseline {base} is not the pin's {pin.tree}",
                                 hint="polyforge vendor fetch --force re-vendors (live edits are backed up)")
    skipped: list[str] = []
    if source is None:
        hit = _from_baseline_cache(ws)
        if hit is not None:
            backup = _swap_in(ws, hit)
            return FetchResult("cache", str(_baseline_cache(pin.tree)), pin.tree, False,
                               time.monotonic() - started, [], backup)
    for candidate in candidates:
        incoming = _incoming(project.vendor_dir)
        try:
            candidate.materialize(cache_dir(), incoming)
            detail = candidate.spelling
            fresh = VendoredTree.initialise(incoming)
            got = fresh.snapshot()
            if got in (pin.tree, pack_base):
                pruned = got != pin.tree
                fresh.commit_baseline(pin.label)
            elif got == pin.pack_tree:
                raise VerificationFailed(
                    f"source '{candidate.name}' is the baseline with {', '.join(pin.pack_prune)} pruned whole ({got}): "
                    f"a pack made for another chain; this chain edits files there and needs {pack_base}",
                    hint="pack the tree in a project with this chain (polyforge vendor pack), or use --full")
            else:
                pruned = ws.adopt_patched(fresh, got, pin.label)
                if pruned is None:
                    raise VerificationFailed(
                        f"source '{candidate.name}' yields tree {got}, the pin says {pin.tree}"
                        + (f" (or {pack_base} pruned)" if pack_base else ""))
            fresh.write_state(source=candidate.name, detail=detail, pruned=pruned)
            if not pruned:
                store_baseline_objects(fresh, got)
        except EnvironmentProblem as exc:
            shutil.rmtree(incoming, ignore_errors=True)
            skipped.append(f"{candidate.name}: {exc.message}")
            if source is not None:
                raise
            continue
        except (PolyforgeError, KeyboardInterrupt):
            shutil.rmtree(incoming, ignore_errors=True)
            raise
        backup = _swap_in(ws, incoming)
        return FetchResult(candidate.name, detail, got, pruned, time.monotonic() - started, skipped, backup)
    raise EnvironmentProblem("no source could be fetched: " + "; ".join(skipped))


def _baseline_cache(tree: str) -> Path:
    return cache_dir() / "baselines" / tree


def baseline_objects(tree: str) -> Path | None:
    """The cached object store holding a proven tree (a git objects folder), or None."""
    folder = _baseline_cache(tree)
    return folder / "objects" if (folder / "complete").exists() else None


def store_baseline_objects(fresh: VendoredTree, tree: str) -> None:
    """Keep the verified baseline's git objects: the next fetch needs no download or hashing."""
    folder = _baseline_cache(tree)
    with FileLock(cache_dir() / "baselines.lock", "baseline cache", blocking=True):
        if (folder / "complete").exists():
            return
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(fresh.path / ".git" / "objects", folder / "objects")
        (folder / "complete").write_text(tree + "\n")


def _link_or_copy_tree(src: Path, dest: Path) -> None:
    """Hard links where possible: git objects are immutable, so sharing them is safe."""
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    shutil.copytree(src, dest, copy_function=link, dirs_exist_ok=True)


def _from_baseline_cache(ws: Workspace) -> Path | None:
    """A vendored repository rebuilt from cached objects, or None on a miss.

    The objects were stored only after their tree id was proven; zlib's checksum on every
    loose object catches corruption on read, and the tree id is checked again here.
    """
    folder = _baseline_cache(ws.pin.tree)
    if not (folder / "complete").exists():
        return None
    incoming = _incoming(ws.project.vendor_dir)
    try:
        with FileLock(cache_dir() / "baselines.lock", "baseline cache", blocking=True):
            fresh = VendoredTree.initialise(incoming)
            _link_or_copy_tree(folder / "objects", incoming / ".git" / "objects")
        fresh.git.read_tree(ws.pin.tree)
        fresh.git.run("checkout-index", "-a", "-f", "-u")
        if fresh.snapshot() != ws.pin.tree:
            raise VerificationFailed("cached baseline does not reproduce the pinned tree")
        fresh.commit_baseline(ws.pin.label)
        fresh.write_state(source="cache", detail=str(folder), pruned=False)
        return incoming
    except (PolyforgeError, OSError):
        shutil.rmtree(incoming, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)  # a bad cache entry is dropped; sources are tried next
        return None


def _swap_in(ws: Workspace, incoming: Path) -> str | None:
    target = ws.project.tree_dir
    backup = None
    if target.exists():
        old = VendoredTree(target)
        dirty = True
        if old.exists():
            try:
                dirty = bool(ws.live_changes()) or bool(old.applied())
            except PolyforgeError:
                dirty = True
        if dirty:
            ws.project.backups_dir.mkdir(parents=True, exist_ok=True)
            dest = ws.project.backups_dir / f"llama.cpp-{time.strftime('%Y%m%d-%H%M%S')}"
            target.rename(dest)
            backup = str(dest)
        else:
            shutil.rmtree(target)
    incoming.rename(target)
    return backup


def status(ws: Workspace, rebase: dict | None = None) -> dict:
    """The pin and the vendored baseline against it; `rebase` is a rebase in progress as the
    chain describes it (None: none), which the baseline cannot be judged without."""
    pin, tree = ws.pin, ws.tree
    info: dict = {"pin": {"release": pin.release, "commit": pin.commit, "tree": pin.tree,
                          "sources": [s.name for s in pin.sources]}, "vendored": tree.exists(),
                  "rebase": rebase}
    if not tree.exists():
        info["ok"] = False
        return info
    base = tree.baseline_tree()
    state = tree.state()
    info.update(baseline_tree=base, baseline_ok=base == ws.expected_base(), pruned=bool(state.get("pruned")),
                source=state.get("source"), detail=state.get("detail"))
    info["ok"] = info["baseline_ok"] and info["rebase"] is None
    return info


def _check_output(out: Path) -> None:
    """Refuse an output path whose folder is missing or not a folder, as tar does: never create it."""
    if out.is_dir():
        raise BadInput(f"cannot write {out}: it is a folder")
    parent = out.parent
    if parent.is_dir():
        return
    first = next(p for p in (parent, *parent.parents) if os.path.lexists(p))  # "/" always exists
    if not first.is_dir():
        raise BadInput(f"cannot write {out}: a parent is not a folder ({first})")
    raise BadInput(f"cannot write {out}: its folder {parent} does not exist",
                   hint="create the folder first; pack does not create folders")


def pack(ws: Workspace, out: Path, patched: bool = False, prune: bool = True) -> dict:
    """Write a tar.xz of the baseline (or the live tree with --patched), pruned by default.
    Reads the tree under the project lock held shared, and compresses (minutes for a full
    tree) after releasing it, so that a build or apply meanwhile neither waits nor fails."""
    if out.suffixes[-2:] != [".tar", ".xz"]:
        raise BadInput(f"{out}: the pack must be a .tar.xz file")
    _check_output(out)
    ws.require_no_rebase()
    with ws.shared():
        packed_tree, prune_list, data = _pack_archive(ws, patched, prune)
    _write_compressed(out, data)
    return {"path": str(out), "tree": packed_tree, "pruned": list(prune_list), "patched": patched,
            "sha256": sha256_file(out), "bytes": out.stat().st_size}


def _pack_archive(ws: Workspace, patched: bool, prune: bool) -> tuple[str, tuple[str, ...], bytes]:
    """The packed tree, the folders left out, and the uncompressed tar of it."""
    tree = ws.tree
    tree.require()
    git = tree.git
    if patched:
        ws.require_clean("pack --patched")
        source_tree = tree.head_tree()
    else:
        source_tree = tree.baseline_tree()
    prune_list = tuple(ws.pin.pack_prune) if prune else ()
    packed_tree = source_tree
    if prune_list:
        keep, expected = ws.pack_expectation(patched)
        packed_tree = prune_tree(git, source_tree, prune_list, keep)
        if expected is not None and packed_tree != expected:
            raise VerificationFailed(f"the pruned tree {packed_tree} is not chain.lock's {expected}",
                                     hint="if the chain changed on purpose, run: polyforge lock")
    # archive a commit (fixed dates) rather than a tree, so every file gets the same mtime
    # and the same inputs give the same bytes
    commit = git.commit_tree(packed_tree, f"polyforge pack of {packed_tree}")
    return packed_tree, prune_list, git.run_bytes("archive", "--format=tar", "--prefix=llama.cpp/", commit)


def _write_compressed(out: Path, data: bytes) -> None:
    partial = out.with_name(out.name + ".part")
    try:
        partial.write_bytes(lzma.compress(data, preset=6))
        partial.replace(out)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        if isinstance(exc, (NotADirectoryError, IsADirectoryError, FileNotFoundError)):
            _check_output(out)  # the folder changed under us: say how, as the up-front check does
        raise EnvironmentProblem(f"cannot write {out}: {exc.strerror or exc}") from None
