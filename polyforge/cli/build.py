"""polyforge build"""

from __future__ import annotations

from typing import List, Optional

import typer
from rich.table import Table

from ..console import err
from ..project import find_project
from . import app
from .render import build_with_progress, emit_json, say


@app.command()
def build(
    cuda: bool = typer.Option(False, "--cuda", help="Build the CUDA backend (GGML_CUDA=ON)."),
    arch: Optional[str] = typer.Option(None, "--arch", help="CUDA architectures, e.g. 90 or 90,120; 90-real leaves out PTX (default: the local GPU's)."),
    target: Optional[List[str]] = typer.Option(None, "--target", help="Build these targets instead of the defaults."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel compile jobs (ninja's default otherwise)."),
    build_type: str = typer.Option("Release", "--type", help="Release, Debug or RelWithDebInfo."),
    define: Optional[List[str]] = typer.Option(None, "-D", help="Extra CMake cache entry KEY=VALUE (part of the key)."),
    print_plan: bool = typer.Option(False, "--print-plan", help="Show the key, directory and cmake arguments; build nothing."),
    list_: bool = typer.Option(False, "--list", help="List the builds under build/."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Build the vendored tree (with the applied chain) out of tree, keyed by its inputs."""
    from polyforge.build import builder as build_lib
    from polyforge.chain.engine import Chain
    project = find_project()
    if list_:
        rows = build_lib.list_builds(project.build_root)
        if json_out:
            emit_json(rows)
            return
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("key", "state", "built at", "patches", "options", "artifacts"):
            table.add_column(col)
        for r in rows:
            opts = r.get("options") or {}
            desc = ("cuda " + ",".join(opts.get("archs", [])) if opts.get("cuda") else "cpu") + f" {opts.get('build_type', '')}"
            table.add_row(r["key"], r["state"], r.get("built_at") or "-", str(len(r.get("chain", []))),
                          desc if opts else "-", str(r.get("artifacts", "-")))
        err.print(table) if rows else say("no builds yet")
        return
    options = build_lib.BuildOptions.make(cuda=cuda, arch=arch, targets=target, build_type=build_type,
                                          defines=define, jobs=jobs)
    chain = Chain(project)
    if print_plan:
        plan = build_lib.plan(chain, options)
        if json_out:
            emit_json(plan.as_dict())
        else:
            d = plan.as_dict()
            say(f"key        {d['key']}\nbuild dir  {d['build_dir']} ({'configured' if d['configured'] else 'new'})")
            say(f"chain      {len(d['inputs']['chain'])} applied patch(es), baseline {d['inputs']['baseline_tree'][:12]}")
            say(f"targets    {' '.join(d['targets'])}")
            say("cmake      " + " ".join(d["cache_args"]))
            if d["remote_cache"]:
                say(f"remote     {d['remote_cache']['url']} (from {d['remote_cache']['from']})")
            for note in d["notes"]:
                say(f"note       {note}")
        return
    result = build_with_progress(quiet=json_out)(chain, options)
    manifest = result.manifest
    if json_out:
        emit_json({"ok": True, "configured": result.configured, "seconds": round(result.seconds, 2),
                   "compiler_cache": result.cache.as_dict() if result.cache else None, "warnings": result.warnings,
                   **manifest.as_dict()})
        return
    libs = [a for a in manifest.artifacts if a.kind == "library"]
    say(f"[green]ok[/] {manifest.key}: {len(libs)} libraries, {len(manifest.artifacts) - len(libs)} binaries in "
        f"{result.seconds:.1f} s{' (configured)' if result.configured else ''}; "
        f"manifest {manifest.build_dir / build_lib.MANIFEST}")
