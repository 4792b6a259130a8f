"""`polyforge bench`: a llama-bench matrix over KV types (-ctk/-ctv pairs) x depths (-d) x
flag sets, with repetitions; writes JSON, a markdown table with ratios against a reference
KV type measured in the same run, and a PNG of decode t/s against depth per KV type.

Every row is a ratio to two pairs measured in the same run: the reference (f16/f16 by default) and
the baseline a user would pick instead of a new type (q8_0/q8_0). Each decode row also gets its
bandwidth roofline, against the memory bandwidth measured on the machine (bandwidth.py) or given:
the bytes a generated token reads (the weights, as llama-bench sizes them, plus the KV cache at the
row's mean depth, from the model's GGUF shape) and the fraction of the bandwidth the row reached.

llama-bench crosses every list it is given, so each (KV pair, flag set) is one invocation
with the depth list; rows are keyed by (kv, flags, test, depth). The build and the model a
bench runs on come from pipeline.run_bench; this module only measures and reports.

How a row gets its numbers (`run`):
  1. measured: `BenchRow.measured` reads one llama-bench JSON result into a row;
  2. derived: passes over all rows fill the metrics that need other rows or the model:
     `add_ratios` (ratio to the reference and to the baseline pair), `add_roofline` (with a bandwidth);
  3. reported: `BenchResult.as_dict` is bench.json and `--json`; `markdown` renders COLUMNS
     into bench.md (and the CLI's table); `plot` draws decode t/s against depth.

Adding a metric, all in this module plus one test:
  - a field on BenchRow. A metric every row has is a plain field; one only some rows or
    some runs have defaults to None with `metadata=OPTIONAL`, and as_dict leaves it out
    where it is None (as the roofline fields are absent from rows without one);
  - where it is computed: from llama-bench's own JSON, in `BenchRow.measured`; from other
    rows or the model's shape, in an `add_<metric>(rows, ...)` pass called from `run` next
    to add_ratios and add_roofline (refuse bad input before the llama-bench runs, as
    `run` does for the roofline's KV sizes);
  - how it shows: a `Column` in COLUMNS (header, cell text, `when` for a column that only
    some runs have); `plot` draws avg_ts alone, so a metric is plotted only by extending it;
  - the test: in tests/bench/test_matrix.py, run `bench.run` on FAKE_BENCH (a fake llama-bench
    whose speeds are known) and assert the metric on a row and its cell in bench.md, as
    test_roofline_columns does. The CLI needs nothing: it prints as_dict and markdown.

agents.py (the agents scenario, llama-batched-bench) measures something else with the same
reporting, so the pieces it shares live here: `kv_pairs` and `check_flag_sets` (the spec checks),
`Row` (as_dict/from_dict), `BenchResult` (subclassed with its own SPEC and ROW), `invoke` (one
run, logged), `add_ratios` (with its own key and value), `table` (COLUMNS-style rendering),
`line_plot` and `save` (bench.json, bench.md, the PNG).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, ClassVar

from polyforge import proc
from polyforge.bench.bandwidth import MemoryBandwidth
from polyforge.errors import BadInput, EnvironmentProblem, VerificationFailed
from polyforge.models.gguf import read_metadata
from polyforge.kvtypes import KV_BITS, kv_pair

OPTIONAL = {"optional": True}  # BenchRow field metadata: left out of as_dict while None


BASELINE = "q8_0/q8_0"  # what a user picks instead of a new K/V type: every table compares against it too


def kv_pairs(kv: list[str], reference: str | None, baseline: str = BASELINE) -> tuple[tuple[str, ...], str]:
    """--kv (comma-separated or repeated) and --ref, checked: the pairs, the reference first
    when it was not among them and the baseline after it (both are measured in the same run),
    and the reference."""
    pairs = [p.strip() for item in kv for p in item.split(",") if p.strip()]
    if not pairs:
        raise BadInput("--kv: give at least one K/V pair, e.g. f16/f16,q8_0/q8_0")
    for pair in pairs:
        if kv_pair(pair) is None:
            raise BadInput(f"--kv {pair}: not a K/V type pair like q8_0/q4_0")
    if kv_pair(baseline) is None:
        raise BadInput(f"--baseline {baseline}: not a K/V type pair like q8_0/q8_0")
    reference = reference or pairs[0]
    for pair in (baseline, reference):
        if pair not in pairs:
            pairs.insert(0, pair)  # measured in the same run
    return tuple(dict.fromkeys(pairs)), reference


def bandwidth_setting(text: str | float | None) -> float | str | None:
    """--bandwidth: "auto" (measure the machine), "off", or a positive number of GB/s."""
    if text is None or text == "off":
        return None
    if text == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise BadInput(f"--bandwidth {text}: give auto, off or a positive number of GB/s")
    return value


def check_flag_sets(sets: list[str] | None) -> tuple[str, ...]:
    """--flags, each a shell-quoted flag set ("" when none was given)."""
    for flags in sets or []:
        try:
            shlex.split(flags)
        except ValueError as exc:
            raise BadInput(f"--flags {flags!r}: {exc}") from None
    return tuple(sets or [""])


def int_list(text: str, option: str) -> list[int]:
    """A comma-separated list of whole numbers from the command line."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"{option} {text}: not a comma-separated list of whole numbers") from None


@dataclass(frozen=True)
class BenchSpec:
    kv: tuple[str, ...]
    reference: str
    depths: tuple[int, ...]
    flag_sets: tuple[str, ...]
    prompts: tuple[int, ...]  # prompt sizes (-p), each a test of its own; 0: none
    n_gen: int
    repetitions: int
    bandwidth: float | str | None = None  # for the decode rooflines: GB/s, "auto" (measured) or None
    baseline: str = BASELINE

    @staticmethod
    def make(kv: list[str], reference: str | None, depths: list[int], flag_sets: list[str] | None,
             prompts: list[int], n_gen: int, repetitions: int, bandwidth: str | float | None = None,
             baseline: str = BASELINE) -> "BenchSpec":
        pairs, reference = kv_pairs(kv, reference, baseline)
        if not depths or any(d < 0 for d in depths):
            raise BadInput("--depth: a list of non-negative depths")
        if repetitions < 1 or any(p < 0 for p in prompts) or n_gen < 0 or (not any(prompts) and n_gen == 0):
            raise BadInput("-r must be >= 1, and -p or -n must be > 0")
        prompts = sorted({p for p in prompts if p > 0}) or [0]
        sets = check_flag_sets(flag_sets)
        return BenchSpec(pairs, reference, tuple(sorted(set(depths))), sets, tuple(prompts), n_gen, repetitions,
                         bandwidth_setting(bandwidth), baseline)

    def header(self) -> dict:
        """bench.json's top-level keys before "spec"."""
        return {"reference": self.reference, "baseline": self.baseline}

    def as_dict(self) -> dict:
        """bench.json's "spec" (the reference and baseline sit at the top level there)."""
        return {"kv": list(self.kv), "depths": list(self.depths), "flags": list(self.flag_sets),
                "prompts": list(self.prompts), "n_gen": self.n_gen, "repetitions": self.repetitions}

    @staticmethod
    def from_dict(data: dict) -> "BenchSpec":
        """From a whole bench.json (before prompt lists, its spec held one "n_prompt")."""
        s = data["spec"]
        prompts = tuple(s["prompts"]) if "prompts" in s else (s["n_prompt"],)
        return BenchSpec(tuple(s["kv"]), data["reference"], tuple(s["depths"]), tuple(s["flags"]), prompts,
                         s["n_gen"], s["repetitions"], baseline=data.get("baseline", BASELINE))


class Row:
    """A row's dict: bench.json's rows (fields with OPTIONAL metadata left out while None)."""

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not (f.metadata.get("optional") and getattr(self, f.name) is None)}

    @classmethod
    def from_dict(cls, data: dict):
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass
class BenchRow(Row):
    """One (kv, flags, test, depth) of the matrix: llama-bench's numbers and the derived metrics."""
    kv: str
    flags: str
    test: str  # tgN, ppN or ppN+tgM
    depth: int
    avg_ts: float
    stddev_ts: float
    samples: int
    n_gen: int
    model_size: int  # bytes of weights, as llama-bench counts them
    ratio: float | None = None  # avg_ts / the reference pair's at the same flags, test, depth
    baseline_ratio: float | None = None  # avg_ts / the baseline pair's (q8_0/q8_0) at the same
    bytes_per_token: int | None = field(default=None, metadata=OPTIONAL)  # decode rows, with --bandwidth
    roofline_ts: float | None = field(default=None, metadata=OPTIONAL)
    roofline_fraction: float | None = field(default=None, metadata=OPTIONAL)

    @staticmethod
    def measured(kv: str, flags: str, result: dict, repetitions: int) -> "BenchRow":
        """A row from one result of llama-bench -o json."""
        return BenchRow(kv=kv, flags=flags, test=test_name(result), depth=int(result.get("n_depth", 0)),
                        avg_ts=float(result["avg_ts"]), stddev_ts=float(result.get("stddev_ts", 0.0)),
                        samples=len(result.get("samples_ts", [])) or repetitions,
                        n_gen=int(result.get("n_gen", 0)), model_size=int(result.get("model_size", 0)))


@dataclass
class BenchResult:
    """A run's result; another scenario subclasses it with its own SPEC and ROW classes."""
    SPEC: ClassVar[Any] = BenchSpec  # header(), as_dict(), from_dict(bench.json)
    ROW: ClassVar[Any] = BenchRow
    spec: Any  # a SPEC
    model: str
    rows: list  # of ROW
    seconds: float
    files: dict[str, str] = field(default_factory=dict)  # json, markdown, png: what run() wrote
    build: str | None = None  # the build's key, set by pipeline.run_bench
    bandwidth: MemoryBandwidth | None = None  # what the rooflines divide by

    def as_dict(self) -> dict:
        """bench.json's shape (written before files and build are known), and --json's."""
        out = {**self.spec.header(), "bandwidth": self.bandwidth.as_dict() if self.bandwidth else None,
               "spec": self.spec.as_dict(), "model": self.model,
               "rows": [r.as_dict() for r in self.rows], "seconds": self.seconds}
        if self.files:
            out["files"] = dict(self.files)
        if self.build is not None:
            out["build"] = self.build
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "BenchResult":
        return cls(cls.SPEC.from_dict(data), data["model"], [cls.ROW.from_dict(r) for r in data["rows"]],
                   data["seconds"], dict(data.get("files", {})), data.get("build"),
                   MemoryBandwidth.from_dict(data.get("bandwidth")))


def test_name(result: dict) -> str:
    """llama-bench's name for a test: tgN (decode), ppN (prompt) or ppN+tgM."""
    if int(result.get("n_gen", 0)) > 0 and int(result.get("n_prompt", 0)) == 0:
        return f"tg{result['n_gen']}"
    if int(result.get("n_prompt", 0)) > 0 and int(result.get("n_gen", 0)) == 0:
        return f"pp{result['n_prompt']}"
    return f"pp{result.get('n_prompt')}+tg{result.get('n_gen')}"


def order_of_test(test: str) -> tuple:
    """A sort key that puts pp64 before pp512 (tgN after the ppN, ppN+tgM last)."""
    numbers = tuple(int(n) for n in re.findall(r"\d+", test))
    return ("+" in test, test[:2], numbers)


def parse_llama_bench(stdout: str) -> list[dict]:
    """llama-bench -o json prints one JSON array (after any log lines)."""
    start = stdout.find("[")
    if start < 0:
        return []
    try:
        data = json.loads(stdout[start:])
    except ValueError:
        return []
    return data if isinstance(data, list) else []


def stem(pair: str, flags: str, extra: str = "") -> str:
    """A run's file name stem: K-V[-EXTRA][-FLAGS]."""
    k, v = pair.split("/")
    return "-".join(p for p in (f"{k}-{v}", extra, re.sub(r"[^A-Za-z0-9]+", "_", flags).strip("_")) if p)


def invoke(argv: list, out_dir: Path, name: str, what: str, timeout: float) -> tuple[str, Path]:
    """Run one benchmark invocation with its command and output in out_dir/NAME.log; its stdout and the
    log, or VerificationFailed "WHAT failed ...: the last stderr line"."""
    done = proc.run(argv, timeout=timeout)
    log_path = out_dir / f"{name}.log"
    log_path.write_text(f"$ {' '.join(done.args)}\n{done.stdout}\n--- stderr\n{done.stderr}")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise VerificationFailed(f"{what}: {last} (log: {log_path})")
    return done.stdout, log_path


def save(result: BenchResult, out_dir: Path, markdown_text: str, png_name: str,
         plot_fn: Callable[[Any, Path], bool]) -> None:
    """bench.json, bench.md and (where plot_fn draws one) the PNG; result.files names them."""
    (out_dir / "bench.json").write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    (out_dir / "bench.md").write_text(markdown_text)
    result.files = {"json": str(out_dir / "bench.json"), "markdown": str(out_dir / "bench.md")}
    png = out_dir / png_name
    if plot_fn(result, png):
        result.files["png"] = str(png)


def roofline_shape(model: Path, pairs: tuple[str, ...], bandwidth: MemoryBandwidth | None,
                   log: Callable[[str], None]) -> "KvShape | None":
    """The model's KV shape for the rooflines, checked before any run: a figure the user gave is refused on a
    model or pair whose bytes are not modelled; a measured one only drops the rooflines, with a log line."""
    if bandwidth is None:
        return None
    try:
        shape = kv_shape(read_metadata(model))
        for pair in pairs:
            shape.bytes_per_token(*pair.split("/"))
        return shape
    except BadInput as exc:
        if bandwidth.given:
            raise
        log(f"no rooflines: {exc}")
        return None


def run(bench_bin: Path, model: Path, spec: BenchSpec, out_dir: Path, *, bandwidth: MemoryBandwidth | None = None,
        timeout: float = 3600, log: Callable[[str], None] = lambda m: None) -> BenchResult:
    """The matrix; `bandwidth` (measured by the caller where spec.bandwidth is "auto") adds the rooflines."""
    if isinstance(spec.bandwidth, float):
        bandwidth = MemoryBandwidth.of(spec.bandwidth)
    shape = roofline_shape(model, spec.kv, bandwidth, log)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[BenchRow] = []
    started = time.monotonic()
    for flags in spec.flag_sets:
        for pair in spec.kv:
            k, v = pair.split("/")
            argv = [bench_bin, "-m", model, "-ctk", k, "-ctv", v, "-d", ",".join(map(str, spec.depths)),
                    "-p", ",".join(map(str, spec.prompts)), "-n", str(spec.n_gen), "-r", str(spec.repetitions),
                    "-o", "json",
                    *shlex.split(flags)]
            log(f"llama-bench {pair} {flags}".rstrip())
            stdout, log_path = invoke(argv, out_dir, stem(pair, flags), f"llama-bench failed for {pair} {flags}",
                                      timeout)
            results = parse_llama_bench(stdout)
            if not results:
                raise VerificationFailed(f"llama-bench printed no results for {pair} (log: {log_path})")
            rows += [BenchRow.measured(pair, flags, r, spec.repetitions) for r in results]
    add_ratios(rows, spec.reference)
    add_ratios(rows, spec.baseline, attr="baseline_ratio")
    if shape is not None:
        add_roofline(rows, shape, bandwidth.reference_gbps)
    result = BenchResult(spec, str(model), rows, round(time.monotonic() - started, 1),
                         bandwidth=bandwidth if shape is not None else None)
    save(result, out_dir, markdown(result), "decode_vs_depth.png", plot)
    return result


# -- derived metrics -----------------------------------------------------------------------
def add_ratios(rows: list, reference: str, key: Callable[[Any], tuple] = lambda r: (r.flags, r.test, r.depth),
               value: Callable[[Any], float] = lambda r: r.avg_ts, attr: str = "ratio") -> None:
    """row.ATTR = value / the reference KV type's value at the same key; for the matrix, avg_ts at
    the same flags, test and depth."""
    ref = {key(r): value(r) for r in rows if r.kv == reference}
    for r in rows:
        base = ref.get(key(r))
        setattr(r, attr, round(value(r) / base, 4) if base else None)


@dataclass(frozen=True)
class KvShape:
    """What one cached token costs per layer: K and V values of every KV head."""
    n_head_kv: tuple[int, ...]  # per layer
    head_dim_k: int
    head_dim_v: int

    def bytes_per_token(self, type_k: str, type_v: str) -> float:
        for t in (type_k, type_v):
            if t not in KV_BITS:
                raise BadInput(f"roofline: no size known for KV type {t}")
        per_layer_head = self.head_dim_k * KV_BITS[type_k] / 8 + self.head_dim_v * KV_BITS[type_v] / 8
        return sum(n * per_layer_head for n in self.n_head_kv)


def kv_shape(meta: dict) -> KvShape:
    """The KV shape from GGUF metadata; models whose layers do not all cache every token (sliding window)
    are refused, since their bytes per token do not follow from the depth."""
    arch = meta.get("general.architecture")
    key = lambda name: meta.get(f"{arch}.{name}")
    n_layer, n_embd, n_head = key("block_count"), key("embedding_length"), key("attention.head_count")
    if not isinstance(n_layer, int) or not isinstance(n_embd, int) or not n_head:
        raise BadInput(f"roofline: the model's GGUF lacks {arch}.block_count/embedding_length/attention.head_count")
    if key("attention.sliding_window"):
        raise BadInput(f"roofline: {arch} has sliding-window layers; its KV bytes per token are not modelled")
    n_head_kv = key("attention.head_count_kv") or n_head
    heads = [n_head_kv] * n_layer if isinstance(n_head_kv, int) else list(n_head_kv)
    n_head0 = n_head if isinstance(n_head, int) else max(n_head)
    head_dim_k = key("attention.key_length") or n_embd // n_head0
    head_dim_v = key("attention.value_length") or n_embd // n_head0
    if len(heads) != n_layer:
        raise BadInput(f"roofline: head_count_kv has {len(heads)} entries for {n_layer} layers")
    return KvShape(tuple(heads), head_dim_k, head_dim_v)


def add_roofline(rows: list[BenchRow], shape: KvShape, bandwidth_gbps: float) -> None:
    """For decode rows: bytes read per generated token (weights + KV at the mean depth of the test),
    the t/s that bandwidth_gbps allows, and the fraction of it reached."""
    for r in rows:
        if not r.test.startswith("tg") or not r.model_size:
            continue
        k, v = r.kv.split("/")
        depth = r.depth + (r.n_gen - 1) / 2
        nbytes = r.model_size + depth * shape.bytes_per_token(k, v)
        r.bytes_per_token = round(nbytes)
        r.roofline_ts = round(bandwidth_gbps * 1e9 / nbytes, 1)
        r.roofline_fraction = round(r.avg_ts / r.roofline_ts, 4)


# -- reporting -----------------------------------------------------------------------------
def cell(value, spec: str = "") -> str:
    """A table cell: the value formatted, "-" for None."""
    return "-" if value is None else format(value, spec)


def _with_bandwidth(result: BenchResult) -> bool:
    return result.bandwidth is not None


@dataclass(frozen=True)
class Column:
    """One column of the markdown table."""
    header: str
    cell: Callable[[Any], str]  # from a row; "-" where the row lacks the value
    numeric: bool = True  # right-aligned
    when: Callable[[Any], bool] = lambda result: True  # a column only some runs have


def table(columns: tuple[Column, ...], result: BenchResult, rows: list) -> list[str]:
    """The markdown table's lines: the columns this result has, one line per row."""
    columns = [c for c in columns if c.when(result)]
    return (["| " + " | ".join(c.header for c in columns) + " |",
             "|" + "|".join("---:" if c.numeric else "---" for c in columns) + "|"]
            + ["| " + " | ".join(c.cell(r) for c in columns) + " |" for r in rows])


COLUMNS = (
    Column("kv", lambda r: r.kv, numeric=False),
    Column("flags", lambda r: r.flags or "-", numeric=False),
    Column("test", lambda r: r.test, numeric=False),
    Column("depth", lambda r: str(r.depth)),
    Column("t/s", lambda r: cell(r.avg_ts, ".2f")),
    Column("±", lambda r: cell(r.stddev_ts, ".2f")),
    Column("ratio", lambda r: cell(r.ratio, ".3f")),
    Column("vs baseline", lambda r: cell(r.baseline_ratio, ".3f")),
    Column("GB/token", lambda r: cell(None if r.bytes_per_token is None else r.bytes_per_token / 1e9, ".2f"),
           when=_with_bandwidth),
    Column("roofline t/s", lambda r: cell(r.roofline_ts, ".0f"), when=_with_bandwidth),
    Column("of bandwidth", lambda r: cell(r.roofline_fraction, ".0%"), when=_with_bandwidth),
)


def title_line(result: BenchResult) -> str:
    """What the ratios and fractions of a table are relative to."""
    spec = result.spec
    return (f"reference: `{spec.reference}` (ratio = t/s / reference t/s), baseline: `{spec.baseline}` "
            f"(vs baseline = t/s / baseline t/s), both from the same run"
            + (f"; roofline at {result.bandwidth.describe()}" if result.bandwidth else ""))


def markdown(result: BenchResult) -> str:
    title = title_line(result)
    rows = sorted(result.rows, key=lambda r: (r.flags, order_of_test(r.test), r.depth, r.kv))
    return "\n".join([title, "", *table(COLUMNS, result, rows)]) + "\n"


def pyplot():
    """matplotlib.pyplot drawing to files (Agg), or EnvironmentProblem without the bench extra."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EnvironmentProblem("the PNG plot needs matplotlib", hint="pip install 'polyforge[bench]'") from None
    return plt


Series = dict[str, list[tuple]]  # a line's label -> its points: (x, y) or (x, y, error)


def line_plot(path: Path, panels: dict[str, Series], *, title: str, xlabel: str, ylabel: str,
              xticks: list[int] | None = None) -> None:
    """One panel per entry (side by side, sharing the y axis), one line per series; with xticks a
    log2 x axis labelled at those values. One panel takes the title; several are titled by key."""
    plt = pyplot()
    ncols = min(len(panels), 3)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7, 4.5) if len(panels) == 1 else (4.8 * ncols, 4 * nrows + 0.5),
                             sharey=True, squeeze=False)
    for ax, (name, series) in zip(axes.flat, panels.items()):
        for label, points in sorted(series.items()):
            points.sort()
            ax.errorbar([p[0] for p in points], [p[1] for p in points],
                        yerr=[p[2] for p in points] if len(points[0]) > 2 else None,
                        marker="o", capsize=3, label=label)
        if xticks:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xticks, [str(x) for x in xticks])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title if len(panels) == 1 else name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if len(panels) > 1:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(result: BenchResult, path: Path) -> bool:
    """Decode t/s against depth, one line per KV type (and flag set); False without tg rows."""
    decode = [r for r in result.rows if r.test.startswith("tg")]
    if not decode:
        return False
    series: Series = {}
    for r in decode:
        label = r.kv + (f" {r.flags}" if r.flags else "")
        series.setdefault(label, []).append((r.depth, r.avg_ts, r.stddev_ts))
    line_plot(path, {"": series}, title=f"decode speed by KV type (reference {result.spec.reference})",
              xlabel="depth (tokens in the KV cache)", ylabel="decode t/s")
    return True
