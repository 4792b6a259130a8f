"""polyforge apply|unapply|status|capture|refresh|fold|move|rename|lock|verify-patches, and chain report"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, TYPE_CHECKING

import typer

from rich.markup import escape
from rich.table import Table

from ..console import err
from ..errors import BadInput, VerificationFailed
from ..project import find_project
from . import app
from .render import emit_json, exclusive_saying_notices, say

if TYPE_CHECKING:  # the library loads when a command runs, so that --help and errors start fast
    from polyforge.chain import queue
    from polyforge.chain import status as status_lib


@app.command()
def apply(
    to: Optional[str] = typer.Option(None, "--to", help="Stop after this patch (NNNN or name)."),
    allow_offset: bool = typer.Option(False, "--allow-offset", help="Accept hunks that apply at an offset."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Apply the chain (patches/*.patch in lexical order) to the vendored tree, atomically."""
    from polyforge.chain.engine import Chain
    chain = Chain(find_project())
    with exclusive_saying_notices(chain):
        report = chain.apply(to, allow_offset)
    applied = sum(row["status"] == "applied" for row in report)
    _render_patch_report(report, json_out, f"{applied} applied, {len(report) - applied} already applied")


@app.command()
def unapply(
    to: Optional[str] = typer.Option(None, "--to", help="Keep patches up to and including this one (default: none)."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Reverse-apply patches from the top, verified by tree id."""
    from polyforge.chain.engine import Chain
    chain = Chain(find_project())
    with exclusive_saying_notices(chain):
        report = chain.unapply(to)
    _render_patch_report(report, json_out, f"{len(report)} unapplied")


def _render_patch_report(report: list[dict], json_out: bool, summary: str) -> None:
    """apply's or unapply's report: a line a patch (with the offsets its hunks applied at, if
    any), then the summary."""
    if json_out:
        emit_json({"ok": True, "patches": report})
        return
    for row in report:
        offsets = f" [yellow](offsets: {', '.join(row['offsets'])})[/]" if row.get("offsets") else ""
        say(f"  {row['name']}: {row['status']}{offsets}")
    say(f"[green]ok[/] {summary}")


@app.command()
def status(json_out: bool = typer.Option(False, "--json")) -> None:
    """Pin and baseline, applied and unapplied patches, live edits, lock drift."""
    from polyforge.chain import status as status_lib
    from polyforge.chain.engine import Chain
    chain = Chain(find_project())
    info = status_lib.read(chain)
    if json_out:
        emit_json(info.as_dict())
        raise typer.Exit(0 if info.ok else 1)
    pin = info.vendor["pin"]
    say(f"pin       {chain.pin.project} {chain.pin.label}, tree {pin['tree'][:12]}")
    if info.rebase:
        _say_rebase(info.rebase)
    if not info.vendored:
        say("vendored  [red]no[/]" + (": the rebase has it moved aside" if info.rebase else " (polyforge vendor fetch)"))
        raise typer.Exit(1)
    say(f"baseline  {info.vendor['baseline_tree'][:12]} "
        + ("[green]ok[/]" if info.vendor["baseline_ok"] else "[red]MISMATCH[/]")
        + (" (pruned)" if info.vendor["pruned"] else ""))
    table = Table(show_header=True, header_style="bold", box=None)
    table.add_column("patch")
    table.add_column("state")
    for name in info.patches:
        state = "[green]applied[/]" if name in info.applied else "unapplied"
        if name in info.applied_changed:
            state = "[red]applied, file changed since[/]"
        table.add_row(name, state)
    for name in info.applied_missing:
        table.add_row(name, "[red]applied, not in patches/[/]")
    if info.patches or info.applied_missing:
        err.print(table)
    else:
        say("patches   none")
    for mismatch in info.chain_mismatch:
        say(f"[red]applied[/] {mismatch}")
    if info.chain_mismatch:
        say("[yellow]polyforge unapply undoes the applied patches by their recorded commits; then apply the chain[/]")
    edits = info.live_edits
    say(f"live edits {len(edits)} file(s)" + (":" if edits else ""))
    for e in edits[:20]:
        say(f"  {e['status']} {e['path']}")
    if len(edits) > 20:
        say(f"  ... and {len(edits) - 20} more")
    for warning in _status_warnings(info):
        say(warning)
    raise typer.Exit(0 if info.ok else 1)


def _say_rebase(rebase: dict) -> None:
    """A rebase in progress comes first: nothing else runs until it ends."""
    onto = f" onto {escape(rebase['release'])} ({escape(rebase['onto'])})" if rebase.get("release") else ""
    where = f", {rebase['replayed']} of {rebase['patches']} patch(es) replayed" if "replayed" in rebase else ""
    say(f"rebase    [red]{rebase['stage']}[/]{onto}{where}")
    say(f"          needs: {escape(rebase['needs'])}")


def _status_warnings(info: status_lib.ChainStatus) -> list[str]:
    """What status warns of after the live edits: chain.lock drift, and what the next command
    will recover or stop on (red: it stops)."""
    warnings = [f"[red]lock drift[/] {drift}" for drift in info.lock_drift]
    if info.journal_problem:
        warnings.append(f"[red]journal[/] {info.journal_problem}: the next command refuses to run until it is resolved")
    elif info.interrupted:
        warnings.append(f"[yellow]an interrupted {info.interrupted} will be recovered by the next command[/]")
    warnings += [f"[yellow]{rel} was left by a polyforge run that died: the next command removes it[/]"
                 for rel in info.git_locks.removable]
    warnings += [f"[red]{rel} exists[/]: a git process is at work in the vendored tree, or one died; "
                 "the next command stops on it" for rel in info.git_locks.blocking]
    return warnings


@app.command()
def capture(
    name: str = typer.Argument(..., help="NNNN-slug of the new patch"),
    message: Optional[str] = typer.Option(None, "-m", "--message", help="Subject line, blank line, description."),
    message_file: Optional[Path] = typer.Option(None, "-F", "--file", help="Read the message from a file."),
    upstream_status: Optional[str] = typer.Option(None, "--upstream-status", help="Pending (the default), Submitted, Backport, Inappropriate [why], ...; overrides the message's trailer."),
    author: Optional[str] = typer.Option(None, "--author", help="'Name <email>' (default: git's user.name and user.email)."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Turn the live edits on top of the applied chain into a new patch."""
    from polyforge.chain.engine import Chain
    message = _message(message, message_file)
    chain = Chain(find_project())
    with chain.exclusive():
        info = chain.capture(name, message, upstream_status, author)
    if json_out:
        emit_json(info)
        return
    say(f"[green]ok[/] captured {info['name']}: {len(info['files'])} file(s), sha256 {info['sha256'][:12]}")
    _say_rebased(info)


@app.command()
def refresh(
    check: bool = typer.Option(False, "--check", help="Fail if regenerating would change a byte."),
    message: Optional[str] = typer.Option(None, "-m", "--message", help="New subject line, blank line, description."),
    message_file: Optional[Path] = typer.Option(None, "-F", "--file", help="Read the new message from a file."),
    author: Optional[str] = typer.Option(None, "--author", help="A new 'Name <email>' for its From: line."),
    reset_author: bool = typer.Option(False, "--reset-author", help="The author from git's user.name and user.email."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Regenerate the top applied patch from the live tree (canonical form)."""
    from polyforge.chain.engine import Chain
    message = _message(message, message_file)
    chain = Chain(find_project())
    with chain.exclusive():
        info = chain.refresh(check, message, _author(author, reset_author))
    if json_out:
        emit_json(info)
        return
    if check:
        say(f"[green]ok[/] {info['name']} is canonical and matches the live tree")
    else:
        say(f"[green]ok[/] {info['name']} " + ("rewritten" if info["changed"] else "unchanged"))
        _say_rebased(info)


def _message(message: Optional[str], message_file: Optional[Path]) -> Optional[str]:
    from polyforge.chain import patchfile
    if message_file is None:
        return message
    if message is not None:
        raise BadInput("give the message with -m or -F, not both")
    return patchfile.read_message_file(message_file)


def _say_rebased(info: dict) -> None:
    for name in info["rebased"]:
        say(f"[green]ok[/] {name} rebased (its hunks moved; content unchanged)")


@app.command()
def lock(json_out: bool = typer.Option(False, "--json")) -> None:
    """Rewrite patches/chain.lock after an intended change to the chain."""
    from polyforge.chain.engine import Chain
    chain = Chain(find_project())
    with chain.exclusive():
        result = chain.relock()
    if json_out:
        emit_json({"base_tree": result.base_tree, "patches": [e.__dict__ for e in result.patches]})
        return
    say(f"[green]ok[/] chain.lock: {len(result.patches)} patch(es) on {result.base_tree[:12]}")


@app.command("verify-patches")
def verify_patches(
    json_out: bool = typer.Option(False, "--json"),
    junit_file: Optional[Path] = typer.Option(None, "--junit", help="Also write a JUnit XML report."),
) -> None:
    """Prove the chain: prefixes, forward and reverse byte identity, lock, canonical form."""
    from polyforge.chain import verify as verify_lib
    from polyforge.chain.engine import Chain
    if junit_file is not None and (junit_file.is_dir() or not junit_file.parent.is_dir()):
        # refused before the proof: a typo should not cost a whole proof
        raise BadInput(f"--junit {junit_file}: " + ("is a folder" if junit_file.is_dir() else "its folder does not exist"))
    chain = Chain(find_project())
    with chain.exclusive():
        proof = verify_lib.verify(chain)
    if junit_file is not None:
        try:
            junit_file.write_text(verify_lib.junit(proof))
        except OSError as exc:
            raise BadInput(f"--junit {junit_file}: cannot write it: {exc.strerror}") from None
    if json_out:
        emit_json(proof.as_dict())
    else:
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("patch", "forward", "reverse", "lock", "canonical", "tree"):
            table.add_column(col)
        for p in proof.patches:
            mark = lambda ok: "[green]ok[/]" if ok else "[red]FAIL[/]"  # noqa: E731
            table.add_row(p.name, mark(p.forward), mark(p.reverse), mark(p.lock), mark(p.canonical), (p.tree or "-")[:12])
        err.print(table)
        for label, comparison in (("forward", proof.forward), ("reverse", proof.reverse)):
            d = comparison.as_dict()
            say(f"{label}: " + ("[green]identical[/]" if comparison.identical else
                                f"[red]differs[/] (differing {d['differing']}, only live {d['only_live']}, only fresh {d['only_fresh']})"))
        for p in proof.patches:
            for problem in p.problems:
                say(f"[red]{p.name}[/]: {problem}")
        for problem in proof.problems:
            say(f"[red]problem[/]: {problem}")
        say(("[green]ok[/]" if proof.ok else "[red]FAILED[/]") + f" in {proof.seconds:.2f} s")
    if not proof.ok:
        raise typer.Exit(VerificationFailed.exit_code)


@app.command()
def fold(
    run: str = typer.Argument(..., help="FIRST..LAST: a contiguous run of the chain (NNNN or names)."),
    into: str = typer.Option(..., "--into", help="NNNN-slug of the folded patch; it must sort where the run stands."),
    message: Optional[str] = typer.Option(None, "-m", "--message", help="Subject line, blank line, description."),
    message_file: Optional[Path] = typer.Option(None, "-F", "--file", help="Read the message from a file."),
    author: Optional[str] = typer.Option(None, "--author", help="'Name <email>' (default: the first patch's)."),
    reset_author: bool = typer.Option(False, "--reset-author", help="The author from git's user.name and user.email."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Fold a run of patches into one, proving it ends on the same tree and the rest still applies."""
    from polyforge.chain import queue
    from polyforge.chain.engine import Chain
    first, sep, last = run.partition("..")
    if not sep or not first or not last:
        raise BadInput(f"{run}: give the run as FIRST..LAST (e.g. 0080..0099)")
    message = _message(message, message_file)
    with exclusive_saying_notices(chain := Chain(find_project())):
        result = queue.fold(chain, first, last, into, message, _author(author, reset_author))
    _render_rewritten(result, json_out)


@app.command()
def move(
    name: str = typer.Argument(..., help="The patch to move (NNNN or name)."),
    after: str = typer.Option(..., "--after", help="The patch it goes after ('base': first)."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Move a patch, proving the chain still applies and builds the same final tree."""
    from polyforge.chain import queue
    from polyforge.chain.engine import Chain
    with exclusive_saying_notices(chain := Chain(find_project())):
        result = queue.move(chain, name, after)
    _render_rewritten(result, json_out)


@app.command()
def rename(
    name: str = typer.Argument(..., help="The patch (NNNN or name)."),
    new_name: str = typer.Argument(..., help="Its new NNNN-slug; it must keep its place in the chain."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Rename a patch (patches/, chain.lock and the applied commits together)."""
    from polyforge.chain import queue
    from polyforge.chain.engine import Chain
    with exclusive_saying_notices(chain := Chain(find_project())):
        result = queue.rename(chain, name, new_name)
    _render_rewritten(result, json_out)


def _author(author: Optional[str], reset_author: bool) -> Optional[str]:
    from polyforge.git import user_identity
    if reset_author and author is not None:
        raise BadInput("give --author or --reset-author, not both")
    return user_identity(find_project().root) if reset_author else author


def _render_rewritten(result: "queue.Rewritten", json_out: bool) -> None:
    if json_out:
        emit_json({"ok": True, **result.as_dict()})
        return
    for patch in result.patches:
        if patch.name in result.statuses:
            say(f"  {patch.name}: {result.statuses[patch.name]}")
    say(f"[green]ok[/] {len(result.patches)} patches; the final tree is unchanged")


chain_app = typer.Typer(no_args_is_help=True, help="Read the chain as a whole.")
app.add_typer(chain_app, name="chain")


@chain_app.command("report")
def chain_report(
    max_rewrites: Optional[int] = typer.Option(None, "--max-rewrites", min=0,
                                               help="Exit 1 when more pairs of patches rewrite each other's lines."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Which patches touch each file, which rewrite lines of earlier ones, and the folds that would not."""
    from polyforge.chain import report as report_lib
    from polyforge.chain.engine import Chain
    chain = Chain(find_project())
    with chain.shared():
        report = report_lib.of_chain(chain)
    pairs = [r for r in report.rewrites if r.lines]
    if json_out:
        emit_json(report.as_dict())
    else:
        say(f"{len(report.patches)} patches, {report.changed_lines} changed lines")
        say(f"rewrites: {len(pairs)} pairs, {report.rewritten_lines} non-trivial lines"
            + (f" (+{len(report.rewrites) - len(pairs)} pairs of trivial lines only)" if len(report.rewrites) > len(pairs) else ""))
        for r in pairs:
            most = sorted(r.files.items(), key=lambda kv: (-kv[1], kv[0]))
            files = ", ".join(f"{path} {n}" for path, n in most[:3]) + (f" and {len(most) - 3} more files" if len(most) > 3 else "")
            say(f"  {r.later} rewrites {r.lines} of {r.earlier}'s lines: {files}")
        say("files touched by most patches:")
        for path, names in report.most_touched(8):
            say(f"  {len(names):3d} {path}")
        vanished: dict[str, list[str]] = {}
        for patch, path in report.vanished:
            vanished.setdefault(patch, []).append(path)
        for patch, paths in vanished.items():
            say(f"[yellow]no line survives[/] of {patch} in {len(paths)} file(s): {', '.join(paths[:3])}"
                + (" ..." if len(paths) > 3 else ""))
        for f in report.folds:
            say(f"fold {f.first[:4]}..{f.last[:4]} would remove {f.rewrites} rewriting pair(s)"
                + (f"; move out first: {', '.join(f.unrelated)}" if f.unrelated else ""))
    if max_rewrites is not None and len(pairs) > max_rewrites:
        raise VerificationFailed(f"{len(pairs)} pairs of patches rewrite each other's lines; at most {max_rewrites} allowed")
