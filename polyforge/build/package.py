"""`polyforge package`: a build's binaries and shared libraries as one relocatable archive, with
a provenance that says exactly what they were built from; and the check of such an archive.

The archive, polyforge-<key>.tar.xz, holds one folder polyforge-<key>/ with
  bin/                      every executable and shared library of build/<key>/bin/ (and their
                            .so links); they find each other through RUNPATH $ORIGIN, so the
                            folder runs wherever it is unpacked
  gates/NAME/verdict.json   every gate verdict recorded on that build
  provenance.json           an in-toto Statement v1 whose predicate is a SLSA provenance v1:
    subject                 every file of bin/ with its sha256 (annotations: library or
                            binary, its links)
    buildDefinition         externalParameters: the build key, options and targets, the pin
                            (project, release, tree id, its sources with their sha256), the chain
                            (each patch's name and sha256, the chain digest, chain.lock's tree
                            after the last of them, the live tree built); internalParameters:
                            the toolchain (compilers, nvcc, cmake; CUDA architectures are in the
                            options) and the cmake arguments; resolvedDependencies: the pin's
                            sources and the patches, as resource descriptors
    runDetails              the builder (polyforge and its version), when the build finished,
                            and as byproducts every gate verdict file with its sha256, whether it
                            passed and whether it judged these very files

The tar is reproducible (sorted members, fixed owner and times), so one build packages to one
archive. `verify` reads an archive without unpacking it and checks every file against the
provenance, every provenance entry against the files, and, in a checkout, the provenance's pin
and chain against vendor/pin.yaml, patches/ and patches/chain.lock.
"""

from __future__ import annotations

import io
import json
import lzma
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import polyforge
from polyforge import schema
from polyforge.build.builder import RUNPATH, Manifest, chain_digest
from polyforge.chain.engine import Chain
from polyforge.errors import BadInput, VerificationFailed
from polyforge.gates.record import RECORD
from polyforge.hashing import sha256_bytes, sha256_file, sha256_files

PROVENANCE = "provenance.json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:polyforge:build:v1"
BUILDER_ID = "urn:polyforge:builder"
SUFFIX = ".tar.xz"
XZ_PRESET = 3  # a CUDA build's libggml-cuda is hundreds of MB: a fast preset, still far smaller than gzip
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._+-]+$")


def archive_name(key: str) -> str:
    return f"polyforge-{key}{SUFFIX}"


# -- what goes in ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    path: str  # inside the top folder: bin/NAME, gates/NAME/verdict.json
    data: bytes


def _bin_entries(manifest: Manifest) -> tuple[list[Entry], list[dict], dict[str, str]]:
    """The build's files (re-read and rehashed: the manifest's hash must still hold), their
    subjects, and the links (link name -> file name)."""
    if not manifest.artifacts:
        raise BadInput(f"build {manifest.key} made no binaries or libraries")
    entries, subjects, links = [], [], {}
    for artifact in manifest.artifacts:
        path = manifest.build_dir / artifact.path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise VerificationFailed(f"{path} is gone since build {manifest.key} finished",
                                     hint="polyforge build again, then package") from None
        digest = sha256_bytes(data)
        if digest != artifact.sha256:
            raise VerificationFailed(f"{path} changed since build {manifest.key} finished (its manifest has "
                                     f"sha256 {artifact.sha256[:12]}, the file {digest[:12]})",
                                     hint="polyforge build again, then package")
        rel = f"bin/{artifact.name}"
        entries.append(Entry(rel, data))
        subjects.append({"name": rel, "digest": {"sha256": digest},
                         "annotations": {"kind": artifact.kind, "links": list(artifact.links)}})
        links.update({link: artifact.name for link in artifact.links})
    return entries, subjects, links


def _verdicts(manifest: Manifest, subjects: list[dict]) -> tuple[list[Entry], list[dict]]:
    """gates/NAME/verdict.json of the build, each a byproduct: its sha256, the verdict, and whether
    the binaries and libraries it judged are the ones packaged (a verdict of an earlier build of
    the same key is shipped too, and says so)."""
    packaged = {PurePosixPath(s["name"]).name: s["digest"]["sha256"] for s in subjects}
    entries, byproducts = [], []
    for path in sorted((manifest.build_dir / "gates").glob(f"*/{RECORD}")):
        data = path.read_bytes()
        rel = f"gates/{path.parent.name}/{RECORD}"
        try:
            record = json.loads(data)
            verdict = record["verdict"]
            ran = record.get("binaries") or {}
            libraries = record.get("inputs", {}).get("libraries")
            ok, gate, recorded_at = verdict.get("ok") is True, verdict.get("gate", path.parent.name), record.get("recorded_at")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise VerificationFailed(f"{path} is not a gate verdict polyforge wrote",
                                     hint="polyforge gate run that gate again, or remove the file") from None
        current = bool(ran) and all(packaged.get(name) == digest for name, digest in ran.items())
        if libraries is not None:
            current = current and libraries == sha256_files(manifest.build_dir / "bin", "*.so*")
        entries.append(Entry(rel, data))
        byproducts.append({"name": rel, "digest": {"sha256": sha256_bytes(data)},
                           "annotations": {"gate": gate, "ok": ok, "recorded_at": recorded_at,
                                           "judged_these_files": current}})
    return entries, byproducts


def _pin_and_sources(chain: Chain) -> tuple[dict, list[dict]]:
    pin = chain.pin
    raw = schema.load_yaml(chain.project.pin_file) or {}
    sources = [dict(s) for s in raw.get("sources", []) if isinstance(s, dict)]
    described = {"project": pin.project, "release": pin.release, "commit": pin.commit, "tree": pin.tree,
                 "sources": sources}
    deps = []
    for s in sources:
        digest = {"gitTree": pin.tree}
        if s.get("sha256"):
            digest["sha256"] = s["sha256"]
        # a package URL (purl) for a PyPI sdist, else where the pin says the source is
        uri = (f"pkg:pypi/{s.get('package')}@{s.get('version')}" if s.get("kind") == "pypi-sdist"
               else str(s.get("location") or s.get("name")))
        deps.append({"name": f"{pin.project} {pin.release} ({s.get('name')})", "uri": uri, "digest": digest,
                     "annotations": {"kind": s.get("kind"), "filename": s.get("filename"), "subdir": s.get("subdir")}})
    return described, deps


def _chain_part(chain: Chain, manifest: Manifest) -> dict:
    applied = [(c["name"], c["sha256"]) for c in manifest.inputs.get("chain", [])]
    lock = chain.chain_lock()
    final = None
    if lock is not None:
        final = lock.base_tree if not applied else (lock.entry(applied[-1][0]).tree if lock.entry(applied[-1][0]) else None)
    return {"patches": [{"name": n, "sha256": s} for n, s in applied], "digest": chain_digest(applied),
            "baseline_tree": manifest.inputs.get("baseline_tree"), "lock_final_tree": final,
            "live_tree": manifest.live_tree, "live_edits": bool(final and manifest.live_tree and final != manifest.live_tree)}


def provenance(chain: Chain, manifest: Manifest, subjects: list[dict], byproducts: list[dict]) -> dict:
    """The in-toto Statement v1 with its SLSA provenance v1 predicate (see the module's docstring)."""
    pin, source_deps = _pin_and_sources(chain)
    chain_info = _chain_part(chain, manifest)
    patch_deps = [{"name": f"patches/{p['name']}", "digest": {"sha256": p["sha256"]}} for p in chain_info["patches"]]
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"key": manifest.key, "options": manifest.inputs.get("options"),
                                       "targets": manifest.targets, "pin": pin, "chain": chain_info},
                "internalParameters": {"toolchain": manifest.inputs.get("toolchain"),
                                       "cmake_args": manifest.cache_args},
                "resolvedDependencies": source_deps + patch_deps,
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"polyforge": polyforge.__version__}},
                "metadata": {"invocationId": manifest.key, "finishedOn": manifest.built_at},
                "byproducts": byproducts,
            },
        },
    }


@dataclass
class Packaged:
    archive: Path
    key: str
    files: int
    bytes: int
    sha256: str
    gates: list[dict]

    def as_dict(self) -> dict:
        return {"archive": str(self.archive), "key": self.key, "files": self.files, "bytes": self.bytes,
                "sha256": self.sha256, "gates": self.gates}


def _tarinfo(name: str, size: int = 0, *, mode: int = 0o644, kind: bytes = tarfile.REGTYPE,
             link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.type, info.linkname = size, mode, kind, link
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def make(chain: Chain, manifest: Manifest, out_dir: Path) -> Packaged:
    """Write out_dir/polyforge-<key>.tar.xz for a finished build."""
    if (manifest.inputs.get("options") or {}).get("runpath") != RUNPATH:
        raise BadInput(f"build {manifest.key} was made before builds set RUNPATH $ORIGIN: its binaries look "
                       f"for their libraries in {manifest.build_dir}/bin", hint="polyforge build (a new key), then package")
    files, subjects, links = _bin_entries(manifest)
    verdict_files, byproducts = _verdicts(manifest, subjects)
    statement = provenance(chain, manifest, subjects, byproducts)
    top = f"polyforge-{manifest.key}"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / archive_name(manifest.key)
    partial = target.with_name(target.name + ".tmp")
    with lzma.open(partial, "wb", preset=XZ_PRESET) as xz, tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        folders = sorted({str(PurePosixPath(e.path).parent) for e in files + verdict_files} | {"gates"})
        tar.addfile(_tarinfo(top, mode=0o755, kind=tarfile.DIRTYPE))
        for folder in folders:
            tar.addfile(_tarinfo(f"{top}/{folder}", mode=0o755, kind=tarfile.DIRTYPE))
        for entry in sorted(files + verdict_files, key=lambda e: e.path):
            mode = 0o755 if entry.path.startswith("bin/") else 0o644
            tar.addfile(_tarinfo(f"{top}/{entry.path}", len(entry.data), mode=mode), io.BytesIO(entry.data))
        for link, name in sorted(links.items()):
            tar.addfile(_tarinfo(f"{top}/bin/{link}", mode=0o777, kind=tarfile.SYMTYPE, link=name))
        data = (json.dumps(statement, indent=2) + "\n").encode()
        tar.addfile(_tarinfo(f"{top}/{PROVENANCE}", len(data)), io.BytesIO(data))
    partial.replace(target)
    return Packaged(target, manifest.key, len(files) + len(verdict_files), target.stat().st_size, sha256_file(target),
                    [{"gate": b["annotations"]["gate"], "ok": b["annotations"]["ok"],
                      "judged_these_files": b["annotations"]["judged_these_files"]} for b in byproducts])


# -- checking one ------------------------------------------------------------------------------
@dataclass
class Verification:
    archive: Path
    key: str | None = None
    files: int = 0
    chain_checked: bool = False
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"ok": self.ok, "archive": str(self.archive), "key": self.key, "files": self.files,
                "chain_checked": self.chain_checked, "problems": self.problems, "notes": self.notes}


def _read_members(archive: Path) -> tuple[str, dict[str, bytes], dict[str, str]]:
    """(the top folder, its files: path -> bytes, its links: path -> target), refusing anything a
    package never holds (paths out of the folder, devices, hard links, links out of bin/)."""
    if not archive.is_file():
        raise BadInput(f"{archive}: no such file")
    files: dict[str, bytes] = {}
    links: dict[str, str] = {}
    tops = set()
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                path = PurePosixPath(member.name)
                if path.is_absolute() or ".." in path.parts or not path.parts:
                    raise VerificationFailed(f"{archive}: member {member.name!r} leaves the package's folder")
                tops.add(path.parts[0])
                rel = "/".join(path.parts[1:])
                if member.isdir():
                    continue
                if member.issym():
                    if not rel.startswith("bin/") or not _SAFE_NAME.match(member.linkname):
                        raise VerificationFailed(f"{archive}: link {member.name} -> {member.linkname} is not a link "
                                                 f"to a file beside it in bin/")
                    links[rel] = member.linkname
                elif member.isfile():
                    extracted = tar.extractfile(member)
                    files[rel] = extracted.read() if extracted else b""
                else:
                    raise VerificationFailed(f"{archive}: member {member.name} is neither a file, a folder nor a link")
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as exc:
        raise VerificationFailed(f"{archive}: not a readable package archive ({exc})") from None
    if len(tops) != 1:
        raise VerificationFailed(f"{archive}: a package holds one folder, this has {len(tops)}")
    return tops.pop(), files, links


def _statement(archive: Path, files: dict[str, bytes]) -> dict:
    raw = files.pop(PROVENANCE, None)
    if raw is None:
        raise VerificationFailed(f"{archive}: no {PROVENANCE}")
    try:
        statement = json.loads(raw)
        predicate = statement["predicate"]
        if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
            raise ValueError("not an in-toto statement with a SLSA provenance predicate")
        for item in statement["subject"] + predicate["runDetails"]["byproducts"]:
            item["name"], item["digest"]["sha256"]  # noqa: B018 - the shape every check below reads
        predicate["buildDefinition"]["externalParameters"]["chain"]["patches"]
    except (ValueError, KeyError, TypeError) as exc:
        raise VerificationFailed(f"{archive}: {PROVENANCE} is not a provenance polyforge wrote ({exc})") from None
    return statement


def verify(archive: Path, chain: Chain | None) -> Verification:
    """Every file against the provenance and back; with a checkout (chain), the provenance's pin and
    chain against it."""
    top, files, links = _read_members(archive)
    statement = _statement(archive, files)
    predicate = statement["predicate"]
    params = predicate["buildDefinition"]["externalParameters"]
    result = Verification(archive, key=params.get("key"))
    if top != f"polyforge-{result.key}":
        result.problems.append(f"the folder {top} is not the provenance's build polyforge-{result.key}")
    listed: dict[str, str] = {}
    for item in statement["subject"] + predicate["runDetails"]["byproducts"]:
        listed[item["name"]] = item["digest"]["sha256"]
    for rel, data in sorted(files.items()):
        want = listed.get(rel)
        if want is None:
            result.problems.append(f"{rel}: in the archive, not in the provenance")
        elif sha256_bytes(data) != want:
            result.problems.append(f"{rel}: sha256 {sha256_bytes(data)[:12]}, the provenance says {want[:12]}")
    result.problems += [f"{rel}: in the provenance, not in the archive" for rel in sorted(set(listed) - set(files))]
    result.files = len(files)
    expected_links = {f"bin/{link}": PurePosixPath(s["name"]).name for s in statement["subject"]
                      for link in (s.get("annotations") or {}).get("links", [])}
    if links != expected_links:
        result.problems.append(f"the links in bin/ are not the provenance's ({sorted(links)} vs {sorted(expected_links)})")
    if chain is not None:
        result.chain_checked = True
        _check_chain(params, chain, result)
    else:
        result.notes.append("not in a polyforge checkout: the chain was not compared with patches/")
    return result


def _check_chain(params: dict, chain: Chain, result: Verification) -> None:
    """The provenance's pin and chain against this checkout's vendor/pin.yaml, patches/ and chain.lock."""
    pin, said = chain.pin, params.get("pin") or {}
    if said.get("tree") != pin.tree or said.get("release") != pin.release:
        result.problems.append(f"built from {said.get('release')} (tree {str(said.get('tree'))[:12]}), this checkout "
                               f"pins {pin.release} (tree {pin.tree[:12]})")
    built = params["chain"]
    patches = [(p.name, p.sha256) for p in chain.patches()]
    said_patches = [(p.get("name"), p.get("sha256")) for p in built["patches"]]
    if said_patches != patches[: len(said_patches)]:
        here = dict(patches)
        for name, digest in said_patches:
            if name not in here:
                result.problems.append(f"the provenance's chain has {name}, patches/ has no such patch")
            elif here[name] != digest:
                result.problems.append(f"the provenance's {name} has sha256 {str(digest)[:12]}, patches/{name} {here[name][:12]}")
        if not result.problems:
            result.problems.append("the provenance's chain is not patches/ in order")
    elif len(said_patches) < len(patches):
        result.notes.append(f"built from the first {len(said_patches)} of the {len(patches)} patches in patches/")
    lock = chain.chain_lock()
    if lock is not None and said_patches:
        entry = lock.entry(said_patches[-1][0])
        if entry is not None and built.get("lock_final_tree") != entry.tree:
            result.problems.append(f"the provenance's chain ends at tree {str(built.get('lock_final_tree'))[:12]}, "
                                   f"chain.lock says {entry.tree[:12]} after {said_patches[-1][0]}")
