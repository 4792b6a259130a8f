"""polyforge bench"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import List, Optional

import typer

from ..console import err
from ..errors import BadInput
from ..project import find_project
from . import app
from .render import build_with_progress, emit_json, say, step_progress


@app.command()
def bench(
    model: str = typer.Option("gemma3-270m", "--model", "-m", help="A model name (polyforge models list), "
                              "random:SHAPE, or a GGUF file's path."),
    kv: Optional[List[str]] = typer.Option(None, "--kv", help="K/V pairs, comma-separated or repeated (default "
                                           "f16/f16,q8_0/q8_0,q4_0/q4_0; with --kld every pair the build supports)."),
    kld: bool = typer.Option(False, "--kld", help="Which K/V types for this model: KL divergence to f16/f16 over a "
                             "text, top-1 agreement and bits per pair (decode t/s too with --depth or --cuda), "
                             "the Pareto front and the cheapest pair within a KLD bound."),
    text: Optional[str] = typer.Option(None, "--text", help="With --kld: the text (default: polyforge's bundled "
                                       "one, about 2,000 tokens)."),
    max_kld: Optional[float] = typer.Option(None, "--max-kld", help="With --kld: the KLD bound of the "
                                            "recommendation (default: q8_0/q4_0's on this model)."),
    ctx: int = typer.Option(512, "--ctx", help="With --kld: the context (chunk) size."),
    chunks: Optional[int] = typer.Option(None, "--chunks", help="With --kld: at most this many chunks of the text."),
    reference: Optional[str] = typer.Option(None, "--ref", help="Reference K/V pair for ratios (default: the first)."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="A second pair every row is also compared "
                                           "with, measured in the same run (default q8_0/q8_0): what a user would "
                                           "pick instead."),
    depth: Optional[str] = typer.Option(None, "--depth", "-d", help="Depths, comma-separated (default 0,512)."),
    flags: Optional[List[str]] = typer.Option(None, "--flags", help="A flag set for llama-bench (or with --agents "
                                              "llama-batched-bench), e.g. '-fa 1' (repeatable)."),
    prompts: Optional[str] = typer.Option(None, "-p", help="Prompt sizes, comma-separated, a test each "
                                          "(default 0: none)."),
    n_gen: int = typer.Option(32, "-n", help="Generated tokens per test (with --agents: per agent)."),
    repetitions: Optional[int] = typer.Option(None, "-r", help="Repetitions (default 3)."),
    agents: Optional[str] = typer.Option(None, "--agents", help="The agents scenario (llama-batched-bench): "
                                         "agent counts B, comma-separated, e.g. 1,4,8,16,32."),
    prefix: Optional[str] = typer.Option(None, "--prefix", help="With --agents: prompt tokens P the agents share, "
                                         "comma-separated (default 32768)."),
    separate: bool = typer.Option(False, "--separate", help="With --agents: B separate P-token prompts, no shared "
                                  "prefix (no -pps -kvu)."),
    rounds: int = typer.Option(1, "--rounds", help="With --agents: run the scenario this many times (KV pairs in "
                               "alternating order) and report the medians and the range of the ratios."),
    build_key: Optional[str] = typer.Option(None, "--build"),
    cuda: bool = typer.Option(False, "--cuda"),
    arch: Optional[str] = typer.Option(None, "--arch"),
    out: Optional[str] = typer.Option(None, "--out", help="Output folder (default build/KEY/bench/TIME)."),
    find_links: Optional[str] = typer.Option(None, "--find-links"),
    bandwidth: str = typer.Option("auto", "--bandwidth", help="Memory bandwidth for each decode row's fraction of "
                                  "it: auto (measured on the bench's device), off, or GB/s."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """A llama-bench matrix: KV types x depths x flags; JSON, markdown, ratios, PNG (and rooflines).
    With --agents: B agents sharing a P-token prefix (llama-batched-bench), decode t/s per KV pair.
    With --kld: KL divergence, top-1 agreement and bits of each K/V pair, and the pair to use."""
    from polyforge import pipeline
    from polyforge.bench import agents as agents_lib
    from polyforge.bench import kld as kld_lib
    from polyforge.bench import matrix as bench_lib
    from polyforge.build import builder as build_lib
    from polyforge.chain.engine import Chain
    kld_only = {"--text": text, "--max-kld": max_kld, "--chunks": chunks, "--ctx": None if ctx == 512 else ctx}
    if not kld:
        for option, value in kld_only.items():
            if value is not None:
                raise BadInput(f"{option} goes with --kld")
    if kld:
        if agents is not None or prefix is not None or separate or rounds != 1 or bandwidth != "auto" \
                or prompts is not None or reference is not None or baseline is not None:
            raise BadInput("--kld measures against f16/f16 and takes no --agents, --prefix, --separate, --rounds, "
                           "--bandwidth, -p, --ref or --baseline")
        if flags is not None and len(flags) > 1:
            raise BadInput("--kld takes one --flags (more llama-perplexity arguments)")
        try:
            perplexity_flags = shlex.split(flags[0]) if flags else []
        except ValueError as exc:
            raise BadInput(f"--flags {flags[0]!r}: {exc}") from None
        depths = bench_lib.int_list("0,512" if depth is None and cuda else depth or "", "--depth")
        spec = kld_lib.KldSpec.make(kv, text, ctx, chunks, max_kld, depths, n_gen,
                                    2 if repetitions is None else repetitions, perplexity_flags)
        chain = Chain(find_project())
        with step_progress(quiet=json_out) as on_progress:
            result = pipeline.run_kld(chain, spec, model=model, build_key=build_key,
                                      options=None if build_key else build_lib.BuildOptions.make(cuda=cuda, arch=arch),
                                      out_dir=Path(out) if out else None, log=lambda m: None,
                                      build_fn=build_with_progress(quiet=json_out),
                                      find_links=Path(find_links) if find_links else None, progress=on_progress)
        if json_out:
            emit_json(result.as_dict())
            return
        err.print(kld_lib.markdown(result), markup=False)
        say(f"[green]ok[/] {len(result.rows)} K/V pairs in {result.seconds} s; " + ", ".join(result.files.values()))
        return
    kv = kv or ["f16/f16,q8_0/q8_0,q4_0/q4_0"]
    if agents is not None:
        matrix_only = {"--depth": depth, "-p": prompts, "-r": repetitions}
        for option, value in matrix_only.items():
            if value is not None:
                raise BadInput(f"{option} is an option of the llama-bench matrix, not of --agents")
        prefixes = bench_lib.int_list("32768" if prefix is None else prefix, "--prefix")
        spec = agents_lib.AgentsSpec.make(kv, reference, bench_lib.int_list(agents, "--agents"), prefixes, n_gen,
                                          separate, flags, rounds, bandwidth, baseline or bench_lib.BASELINE)
        run, render = pipeline.run_agents, agents_lib.markdown
    else:
        if prefix is not None or separate or rounds != 1:
            raise BadInput("--prefix, --separate and --rounds go with --agents")
        depths = bench_lib.int_list("0,512" if depth is None else depth, "--depth")
        spec = bench_lib.BenchSpec.make(kv, reference, depths, flags, bench_lib.int_list(prompts or "0", "-p"), n_gen,
                                        3 if repetitions is None else repetitions, bandwidth,
                                        baseline or bench_lib.BASELINE)
        run, render = pipeline.run_bench, bench_lib.markdown
    chain = Chain(find_project())
    result = run(chain, spec, model=model, build_key=build_key,
                 options=None if build_key else build_lib.BuildOptions.make(cuda=cuda, arch=arch),
                 out_dir=Path(out) if out else None, log=lambda m: say(f"[dim]{m}[/]"),
                 build_fn=build_with_progress(quiet=json_out), find_links=Path(find_links) if find_links else None)
    if json_out:
        emit_json(result.as_dict())
        return
    err.print(render(result), markup=False)
    say(f"[green]ok[/] {len(result.rows)} rows in {result.seconds} s; " + ", ".join(result.files.values()))
