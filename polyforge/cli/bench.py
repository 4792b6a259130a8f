"""polyforge bench"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from polyforge.bench import matrix as bench_lib
from polyforge.build import builder as build_lib
from .. import pipeline
from polyforge.chain.engine import Chain
from ..console import err
from ..project import find_project
from . import app
from .render import build_with_progress, emit_json, say


@app.command()
def bench(
    model: str = typer.Option("gemma3-270m", "--model", "-m", help="A model name (polyforge models list) or random:SHAPE."),
    kv: List[str] = typer.Option(["f16/f16,q8_0/q8_0,q4_0/q4_0"], "--kv", help="K/V pairs, comma-separated or repeated."),
    reference: Optional[str] = typer.Option(None, "--ref", help="Reference K/V pair for ratios (default: the first)."),
    depth: str = typer.Option("0,512", "--depth", "-d", help="Depths, comma-separated."),
    flags: Optional[List[str]] = typer.Option(None, "--flags", help="A llama-bench flag set, e.g. '-fa 1' (repeatable)."),
    n_prompt: int = typer.Option(0, "-p", help="Prompt tokens per test (0: none)."),
    n_gen: int = typer.Option(32, "-n", help="Generated tokens per test."),
    repetitions: int = typer.Option(3, "-r", help="Repetitions."),
    build_key: Optional[str] = typer.Option(None, "--build"),
    cuda: bool = typer.Option(False, "--cuda"),
    arch: Optional[str] = typer.Option(None, "--arch"),
    out: Optional[str] = typer.Option(None, "--out", help="Output folder (default build/KEY/bench/TIME)."),
    find_links: Optional[str] = typer.Option(None, "--find-links"),
    bandwidth: Optional[float] = typer.Option(None, "--bandwidth",
                                              help="Memory bandwidth in GB/s: add each decode row's roofline."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """A llama-bench matrix: KV types x depths x flags; JSON, markdown, ratios, PNG (and rooflines)."""
    try:
        depths = [int(d) for d in depth.split(",") if d.strip()]
    except ValueError:
        raise typer.BadParameter("--depth takes integers, e.g. 0,512,2048") from None
    spec = bench_lib.BenchSpec.make(kv, reference, depths, flags, n_prompt, n_gen, repetitions, bandwidth)
    chain = Chain(find_project())
    result = pipeline.run_bench(chain, spec, model=model, build_key=build_key,
                                options=None if build_key else build_lib.BuildOptions.make(cuda=cuda, arch=arch),
                                out_dir=Path(out) if out else None, log=lambda m: say(f"[dim]{m}[/]"),
                                build_fn=build_with_progress(quiet=json_out),
                                find_links=Path(find_links) if find_links else None)
    if json_out:
        emit_json(result.as_dict())
        return
    err.print(bench_lib.markdown(result), markup=False)
    say(f"[green]ok[/] {len(result.rows)} rows in {result.seconds} s; " + ", ".join(result.files.values()))
