"""`polyforge bench --kld`: which K/V cache types to use for one model. For each K/V pair, the KL
divergence of the next-token distributions against an f16/f16 cache over a text (the gates'
llama-perplexity runs: gates.perplexity_kld), the top-1 agreement, the bits per K+V element
(kvtypes), and with depths decode t/s from llama-bench on the same build (matrix.run); then the
Pareto front over (bits, KLD) and a recommendation: the pair with the fewest bits whose mean KLD
stays under a bound (q8_0/q4_0's on this model, or --max-kld), as the -ctk/-ctv flags to use.

Every pair runs with flash attention on: llama.cpp quantizes the V cache only with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from polyforge import proc
from polyforge.errors import BadInput, VerificationFailed
from polyforge.gates import perplexity_kld
from polyforge.kvtypes import KV_BITS, bits_per_pair, dominates, kv_pair
from . import matrix

DEFAULT_TEXT = Path(__file__).resolve().parents[1] / "data" / "kld-text.txt"
REFERENCE = "f16/f16"
BOUND_PAIR = "q8_0/q4_0"  # the default bound: this pair's KLD on the model
FLASH_ATTENTION = ("-fa", "on")
# f32 and bf16 caches cost more bits than the f16 reference for nothing a user would choose
NOT_CANDIDATES = ("f32", "bf16")

Progress = Callable[[int, int, str], None]  # (done, total, what is running)


def default_pairs(types: tuple[str, ...]) -> tuple[str, ...]:
    """The pairs worth measuring among the build's KV types: each type for K and V alike, and q8_0
    keys with each cheaper V type (keys are the more sensitive half); most bits first."""
    usable = [t for t in types if t not in NOT_CANDIDATES and t in KV_BITS]
    pairs = [f"{t}/{t}" for t in usable]
    if "q8_0" in usable:
        pairs += [f"q8_0/{t}" for t in usable if KV_BITS[t] < KV_BITS["q8_0"]]
    return tuple(sorted(dict.fromkeys(pairs), key=lambda p: (-bits_per_pair(p), p)))


def supported_types(help_text: str) -> tuple[str, ...]:
    """The cache types a llama.cpp binary accepts, from its --help ("-ctk ... allowed values: a, b")."""
    start = help_text.find("--cache-type-k")
    at = help_text.find("allowed values:", start) if start >= 0 else -1
    if at < 0:
        return ()
    # the list wraps over lines; it ends at the line that does not end with a comma
    text = ""
    for line in help_text[at + len("allowed values:"):].splitlines():
        text += " " + line.strip()
        if not line.rstrip().endswith(","):
            break
    return tuple(t.strip() for t in text.split(",") if t.strip())


@dataclass(frozen=True)
class KldSpec:
    kv: tuple[str, ...] | None  # the pairs named (None: every pair the build supports, default_pairs)
    text: Path
    ctx: int
    chunks: int | None
    max_kld: float | None  # the bound; None: BOUND_PAIR's KLD, measured in the same run
    depths: tuple[int, ...] = ()  # decode t/s at these depths (none: no llama-bench)
    n_gen: int = 32
    repetitions: int = 2
    flags: tuple[str, ...] = ()  # more llama-perplexity arguments

    @staticmethod
    def make(kv: list[str] | None, text: str | None, ctx: int, chunks: int | None, max_kld: float | None,
             depths: list[int], n_gen: int = 32, repetitions: int = 2, flags: list[str] | None = None) -> "KldSpec":
        pairs = None
        if kv:
            named = [p.strip() for item in kv for p in item.split(",") if p.strip()]
            for pair in named:
                if kv_pair(pair) is None:
                    raise BadInput(f"--kv {pair}: not a K/V type pair like q8_0/q4_0")
                k, v = pair.split("/")
                for t in (k, v):
                    if t not in KV_BITS:
                        raise BadInput(f"--kv {pair}: unknown KV type {t} (known: {', '.join(KV_BITS)})")
            pairs = tuple(dict.fromkeys(named))
        path = DEFAULT_TEXT if text is None else Path(text)
        if not path.is_file():
            raise BadInput(f"--text {text}: no such file")
        if ctx < 16 or (chunks is not None and chunks < 1):
            raise BadInput("--ctx must be >= 16 and --chunks >= 1")
        if max_kld is not None and not max_kld > 0:
            raise BadInput("--max-kld takes a positive number")
        if any(d < 0 for d in depths) or n_gen < 1 or repetitions < 1:
            raise BadInput("--depth takes non-negative depths; -n and -r must be >= 1")
        extra = tuple(flags or ())
        return KldSpec(pairs, path.resolve(), ctx, chunks, max_kld, tuple(sorted(set(depths))), n_gen, repetitions,
                       extra)

    def measured(self, types: tuple[str, ...]) -> tuple[str, ...]:
        """What the run measures on a build with these KV types: the reference, the pairs (named or
        default_pairs), and BOUND_PAIR when it sets the bound; a named type the build lacks is refused."""
        pairs = self.kv if self.kv is not None else default_pairs(types)
        for pair in pairs:
            for t in pair.split("/"):
                if t not in types:
                    raise BadInput(f"--kv {pair}: this build has no KV type {t} (it has: {', '.join(types)})")
        extra = (BOUND_PAIR,) if self.max_kld is None else ()
        return tuple(dict.fromkeys((REFERENCE, *pairs, *extra)))

    def as_dict(self) -> dict:
        return {"kv": list(self.kv) if self.kv is not None else None, "text": str(self.text), "ctx": self.ctx,
                "chunks": self.chunks, "max_kld": self.max_kld, "depths": list(self.depths), "n_gen": self.n_gen,
                "repetitions": self.repetitions, "flags": list(self.flags)}


@dataclass
class KldRow(matrix.Row):
    kv: str
    bits: float  # K + V bits per cached element
    kld_mean: float
    kld_p99: float | None
    kld_max: float | None
    top1: float | None  # % of tokens whose most likely next token is the reference's
    ppl: float | None
    kv_mib: float | None
    pareto: bool = False  # no other pair has fewer-or-equal bits and lower-or-equal KLD, one strictly
    decode_ts: dict[str, float] | None = field(default=None, metadata=matrix.OPTIONAL)  # depth -> t/s


@dataclass
class Recommendation:
    pair: str
    bound: float
    bound_from: str  # BOUND_PAIR or "--max-kld"

    @property
    def flags(self) -> str:
        k, v = self.pair.split("/")
        return f"-ctk {k} -ctv {v}"

    def as_dict(self) -> dict:
        return {"pair": self.pair, "flags": self.flags, "bound": self.bound, "bound_from": self.bound_from}


@dataclass
class KldResult:
    spec: KldSpec
    model: str
    rows: list[KldRow]
    recommendation: Recommendation
    base: dict  # the reference run: ppl, kv_mib
    seconds: float
    files: dict[str, str] = field(default_factory=dict)
    build: str | None = None

    def as_dict(self) -> dict:
        out = {"reference": REFERENCE, "spec": self.spec.as_dict(), "model": self.model, "base": self.base,
               "rows": [r.as_dict() for r in self.rows], "recommendation": self.recommendation.as_dict(),
               "seconds": self.seconds}
        if self.files:
            out["files"] = dict(self.files)
        if self.build is not None:
            out["build"] = self.build
        return out


# -- the rules -----------------------------------------------------------------------------
def mark_pareto(rows: list[KldRow]) -> None:
    """pareto = no other row dominates it in (bits, kld_mean)."""
    for r in rows:
        r.pareto = not any(dominates((o.bits, o.kld_mean), (r.bits, r.kld_mean)) for o in rows if o is not r)


def recommend(rows: list[KldRow], max_kld: float | None) -> Recommendation:
    """The pair with the fewest bits whose mean KLD is <= the bound (max_kld, or BOUND_PAIR's KLD);
    among equal bits the lower KLD. The reference (KLD ~0) always qualifies."""
    if max_kld is not None:
        bound, source = max_kld, "--max-kld"
    else:
        row = next((r for r in rows if r.kv == BOUND_PAIR), None)
        if row is None:
            raise BadInput(f"no bound: give --max-kld, or measure {BOUND_PAIR}")
        bound, source = row.kld_mean, BOUND_PAIR
    within = [r for r in rows if r.kld_mean <= bound]
    if not within:
        raise VerificationFailed(f"no pair has a mean KLD within {bound:g}, not even {REFERENCE}")
    best = min(within, key=lambda r: (r.bits, r.kld_mean))
    return Recommendation(best.kv, bound, source)


# -- the run -------------------------------------------------------------------------------
def build_types(perplexity_bin: Path) -> tuple[str, ...]:
    done = proc.run([perplexity_bin, "--help"], timeout=60)
    types = supported_types(done.stdout + done.stderr)
    if not types:
        raise VerificationFailed(f"{perplexity_bin} --help lists no cache types (-ctk ... allowed values)")
    return types


def run(perplexity_bin: Path, bench_bin: Path | None, model: Path, spec: KldSpec, out_dir: Path, *,
        timeout: float = 3600, log: Callable[[str], None] = lambda m: None,
        progress: Progress = lambda done, total, what: None) -> KldResult:
    pairs = spec.measured(build_types(perplexity_bin))  # refused before any run
    if spec.depths and bench_bin is None:
        raise BadInput("decode speed (--depth) needs llama-bench in the build")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    total = 1 + len(pairs) + (len(pairs) if spec.depths else 0)
    common = perplexity_kld.common_args(model, spec.ctx, spec.chunks, [*FLASH_ATTENTION, *spec.flags])
    base_file = out_dir / "base.kld"
    rows: list[KldRow] = []
    try:
        progress(0, total, f"{REFERENCE}: saving logits")
        log(f"{REFERENCE}: saving the reference logits")
        base = perplexity_kld.save_base(perplexity_bin, common, spec.text, REFERENCE, base_file,
                                        out_dir / "base.log", timeout)
        for i, pair in enumerate(pairs, 1):
            progress(i, total, f"{pair}: KL divergence")
            log(f"{pair}: KL divergence against {REFERENCE}")
            k, v = pair.split("/")
            m = perplexity_kld.measure_pair(perplexity_bin, common, pair, base_file, out_dir / f"{k}-{v}.log",
                                            timeout)
            if "kld_mean" not in m:
                raise VerificationFailed(f"llama-perplexity printed no KLD for {pair} (log: {out_dir / f'{k}-{v}.log'})")
            # + 0.0: llama-perplexity prints the reference's KLD as -0.000000
            rows.append(KldRow(pair, bits_per_pair(pair), m["kld_mean"] + 0.0, m.get("kld_p99"), m.get("kld_max"),
                               m.get("top1"), m.get("ppl"), m.get("kv_mib")))
    finally:
        base_file.unlink(missing_ok=True)  # n_vocab x tokens of logits: large
    if spec.depths:
        add_speed(rows, bench_bin, model, spec, out_dir / "speed", log,
                  lambda i, what: progress(1 + len(pairs) + i, total, what))
    progress(total, total, "done")
    mark_pareto(rows)
    rec = recommend(rows, spec.max_kld)
    base = {k: v for k, v in base.items() if k != "bits_per_pair"}
    result = KldResult(spec, str(model), rows, rec, base, round(time.monotonic() - started, 1))
    matrix.save(result, out_dir, markdown(result), "bits_vs_kld.png", plot)
    return result


def add_speed(rows: list[KldRow], bench_bin: Path, model: Path, spec: KldSpec, out_dir: Path,
              log: Callable[[str], None], step: Callable[[int, str], None]) -> None:
    """Decode t/s of each pair at spec.depths: the llama-bench matrix (matrix.run), one pair at a time."""
    for i, r in enumerate(rows):
        step(i, f"{r.kv}: decode speed")
        # the pair as its own reference and baseline: one llama-bench run, nothing else measured
        bench_spec = matrix.BenchSpec.make([r.kv], r.kv, list(spec.depths), ["-fa 1"], [0], spec.n_gen,
                                           spec.repetitions, None, baseline=r.kv)
        measured = matrix.run(bench_bin, model, bench_spec, out_dir / r.kv.replace("/", "-"), log=log)
        r.decode_ts = {str(b.depth): round(b.avg_ts, 2) for b in measured.rows if b.test.startswith("tg")}


# -- reporting -----------------------------------------------------------------------------
def _speed(r: KldRow) -> str:
    return " / ".join(f"{ts:.1f}" for _, ts in sorted(r.decode_ts.items(), key=lambda kv: int(kv[0])))


COLUMNS = (
    matrix.Column("K/V", lambda r: r.kv, numeric=False),
    matrix.Column("bits", lambda r: f"{r.bits:g}"),
    matrix.Column("KLD", lambda r: f"{r.kld_mean:.4f}"),
    matrix.Column("KLD p99", lambda r: matrix.cell(r.kld_p99, ".3f")),
    matrix.Column("top-1 %", lambda r: matrix.cell(r.top1, ".1f")),
    matrix.Column("PPL", lambda r: matrix.cell(r.ppl, ".3f")),
    matrix.Column("KV MiB", lambda r: matrix.cell(r.kv_mib, ".2f")),
    matrix.Column("Pareto", lambda r: "yes" if r.pareto else "", numeric=False),
    matrix.Column("decode t/s", _speed, when=lambda result: bool(result.spec.depths)),
)


def markdown(result: KldResult) -> str:
    spec, rec = result.spec, result.recommendation
    depths = f"; decode t/s at depths {', '.join(map(str, spec.depths))}" if spec.depths else ""
    title = (f"KL divergence to {REFERENCE} over {spec.text.name} (ctx {spec.ctx}"
             f"{f', {spec.chunks} chunks' if spec.chunks else ''}){depths}")
    rows = sorted(result.rows, key=lambda r: (-r.bits, r.kld_mean))
    source = "--max-kld" if rec.bound_from == "--max-kld" else f"{rec.bound_from}'s KLD"
    return "\n".join([title, "", *matrix.table(COLUMNS, result, rows), "",
                      f"recommended: `{rec.flags}` ({rec.pair}: the fewest bits with KLD <= {rec.bound:.4g}, "
                      f"{source})"]) + "\n"


def plot(result: KldResult, path: Path) -> bool:
    """Bits per K+V element against mean KLD (log scale), each pair labelled (with its decode t/s at the
    deepest depth where measured), the Pareto front joined, the recommended pair ringed."""
    plt = matrix.pyplot()
    floor = min((r.kld_mean for r in result.rows if r.kld_mean > 0), default=1e-4) / 3
    y = lambda r: max(r.kld_mean, floor)  # noqa: E731 - the reference's KLD is ~0: drawn at the floor
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for i, r in enumerate(sorted(result.rows, key=lambda r: r.bits)):
        ax.scatter(r.bits, y(r), color="tab:blue" if r.pareto else "tab:gray", zorder=3)
        label = r.kv + (" (KLD ~0)" if r.kld_mean < floor else "")
        if r.decode_ts:
            deepest = max(r.decode_ts, key=int)
            label += f"\n{r.decode_ts[deepest]:.1f} t/s @{deepest}"
        # neighbours in bits (q8_0/turbo4 and q8_0/q4_0) take labels above and below in turn
        ax.annotate(label, (r.bits, y(r)), textcoords="offset points", xytext=(5, 4 if i % 2 else -12), fontsize=7)
    front = sorted((r for r in result.rows if r.pareto), key=lambda r: r.bits)
    ax.plot([r.bits for r in front], [y(r) for r in front], color="tab:blue", label="Pareto front")
    rec = next(r for r in result.rows if r.kv == result.recommendation.pair)
    ax.scatter(rec.bits, y(rec), s=200, facecolors="none", edgecolors="tab:red", zorder=4,
               label=f"recommended: {result.recommendation.flags}")
    ax.axhline(result.recommendation.bound, color="tab:red", linestyle=":", label="KLD bound")
    ax.set_yscale("log")
    ax.set_xlabel("bits per K+V element pair")
    ax.set_ylabel(f"mean KLD to {REFERENCE} (log)")
    ax.set_title(f"{Path(result.model).name}: KV cache bits against KLD")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
