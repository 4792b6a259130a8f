"""polyforge package"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from polyforge.errors import BadInput, VerificationFailed
from ..project import find_project
from . import app
from .render import emit_json, say


@app.command()
def package(
    build: Optional[str] = typer.Option(None, "--build", help="The build key (or a unique prefix); default: the key `polyforge build` with the same --cuda/--arch makes now."),
    cuda: bool = typer.Option(False, "--cuda", help="Default to the CUDA build's key."),
    arch: Optional[str] = typer.Option(None, "--arch", help="With --cuda: the architectures of the build to package."),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder for the archive (default: dist/ of the project)."),
    verify: Optional[Path] = typer.Option(None, "--verify", help="Check this archive against its provenance (and, in a checkout, against the chain) instead."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """A build's binaries and libraries as one relocatable archive with its provenance (in-toto/SLSA), or --verify one."""
    from polyforge.build import builder as build_lib
    from polyforge.build import package as package_lib
    from polyforge.chain.engine import Chain
    if verify is not None:
        if build or cuda or arch or out:
            raise BadInput("--verify takes an archive alone (no --build, --cuda, --arch or --out)")
        _verify(verify, json_out)
        return
    project = find_project()
    chain = Chain(project)
    if build is None:
        build = build_lib.plan(chain, build_lib.BuildOptions.make(cuda=cuda, arch=arch)).key
    elif cuda or arch:
        raise BadInput("--build names the build: no --cuda or --arch with it")
    manifest = build_lib.find_build(project.build_root, build)
    done = package_lib.make(chain, manifest, out or project.root / "dist")
    if json_out:
        emit_json({"ok": True, **done.as_dict()})
        return
    say(f"[green]ok[/] {done.archive}: {done.files} files, {done.bytes / 2**20:.1f} MiB, sha256 {done.sha256}")
    for g in done.gates:
        state = "pass" if g["ok"] else "FAIL"
        say(f"  gate {escape(str(g['gate']))}: {state}" + ("" if g["judged_these_files"] else " (judged other files of this key)"))
    if not done.gates:
        say("  [yellow]no gate verdicts recorded on this build[/]")


def _verify(archive: Path, json_out: bool) -> None:
    from polyforge.build import package as package_lib
    from polyforge.chain.engine import Chain
    try:
        chain = Chain(find_project())
    except BadInput:
        chain = None  # outside a checkout: the archive against its own provenance only
    result = package_lib.verify(archive, chain)
    if json_out:
        emit_json(result.as_dict())
        if not result.ok:
            raise typer.Exit(1)
        return
    for note in result.notes:
        say(f"[yellow]note[/] {escape(note)}")
    if not result.ok:
        for problem in result.problems[1:]:
            say(f"  {escape(problem)}")
        more = f" (and {len(result.problems) - 1} more above)" if len(result.problems) > 1 else ""
        raise VerificationFailed(f"{archive}: {result.problems[0]}{more}")
    say(f"[green]ok[/] {archive}: {result.files} files match the provenance of build {result.key}"
        + ("; its pin and chain are this checkout's" if result.chain_checked else ""))
