"""`polyforge bench --agents`: B agents sharing a P-token prefix, as llama-server's shared pool
serves them, measured with llama-batched-bench per KV type (-ctk/-ctv pair) x prefix P x agent
count B; writes JSON, a markdown table with each pair's decode t/s as a ratio to a reference
pair measured in the same run, and a PNG of decode t/s against B (a panel per KV pair, a line
per prefix).

Why: an agent fleet on one server is many sequences decoding together over one long shared
prompt (a system prompt, a repository, a tool catalogue). What a KV type costs or saves there is
not the llama-bench matrix's single-sequence decode at a depth: each of the B tokens of a decode
step attends over the shared P cells plus its own, out of one unified KV cache. So the shared
scenario runs `llama-batched-bench -pps -kvu` (the prefix is decoded once and copied to every
sequence as llama-server's unified cache holds it); `--separate` drops -pps -kvu and measures B
separate P-token prompts, each in its own KV stream, for comparison.

What llama-batched-bench prints (tools/batched-bench/batched-bench.cpp), and what follows here:
  - it crosses -npp x -ntg x -npl; with `--output-format jsonl` each combination is one JSON line
    on stdout ({"pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed",
    and the context's settings}); the default is a markdown table with the same numbers
    (| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |). Log lines go
    to stderr. This module asks for jsonl.
  - it silently skips a combination whose cells (N_KV: P + B*N shared, B*(P+N) separate) exceed
    its context, which defaults to the model's trained context; so each invocation gets -c for its
    prefix at the largest B, and a B that still did not come back is an error, not a missing row.
  - it can lose its last output lines: its logger (common/log.cpp) prints from a thread that is
    not joined at exit (llama.cpp issue 22142), so a run that exits soon after its last result
    drops that line (17 of 70 runs of a tiny model on a CPU build; with nothing to run, even the
    table's header). So each invocation ends with a cheap DRAIN_PP-token prompt after P
    (-npp P,1) whose lines are not kept: P's lines are printed while it runs (0 lost of 40).
  - S_TG t/s is B*N generated tokens over the decode time: all agents together. S_PP t/s counts
    the prompt tokens decoded: P with -pps (the prefix once), B*P without; the prompt t/s of the
    two modes are not the same quantity. N_KV is the cells required, not measured.

Each (flag set, prefix, KV pair) is one invocation with the whole -npl list; rows are keyed by
(kv, flags, prefix, agents). With --rounds R the whole scenario runs R times (KV pairs in alternating
order) and each row is the rounds' median: on a GPU the same decode can move by 10-20 % between
runs, more than one run's ratio can be trusted for. matrix.py holds what the two scenarios share:
the --kv/--ref and --flags checks, Row, BenchResult, invoke, add_ratios, the Column table, line_plot
and save. The build and the model come from pipeline.run_agents; this module only measures and
reports.

How a row gets its numbers (`run`):
  1. measured: `AgentRow.measured` reads one jsonl line of llama-batched-bench into a row;
  2. derived: `matrix.add_ratios` keyed by `AgentRow.point` on decode_ts (ratio to the reference
     KV pair at the same flags, prefix and B);
  2b. with rounds: `median_rows` folds the rounds' rows into one each (medians; ratio_min/max);
  3. reported: `AgentsResult.as_dict` is bench.json and `--json`; `markdown` renders COLUMNS into
     bench.md (and the CLI's table); `plot` draws decode t/s against B.

Adding a metric, all in this module plus one test:
  - a field on AgentRow (a plain field if every row has it; `metadata=matrix.OPTIONAL` and a None
    default if only some do, and as_dict leaves it out while None);
  - where it is computed: from the jsonl line, in `AgentRow.measured` (e.g. decode t/s per agent,
    speed_tg / pl); from other rows, in a pass called from `run` next to add_ratios;
  - how it shows: a `matrix.Column` in COLUMNS; `plot` draws decode_ts alone;
  - the test: in tests/bench/test_agents.py, run `agents.run` on FAKE_BATCHED_BENCH (a fake
    llama-batched-bench whose speeds are known) and assert the row and its cell in bench.md.
"""

from __future__ import annotations

import json
import shlex
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from polyforge.bench import matrix
from polyforge.bench.matrix import Column, cell
from polyforge.errors import BadInput, VerificationFailed

TOOL = "llama-batched-bench"
MAX_AGENTS = 256  # LLAMA_MAX_SEQ: the most sequences one llama.cpp context holds
MAX_CELLS = 2**31 - 1  # the tool's context size is an int32
ALWAYS = ("-fa", "on", "-ngl", "99", "--output-format", "jsonl")  # before the flag set, which may override
SHARED = ("-pps", "-kvu")  # one prefix, copied into every sequence of one unified KV cache
DRAIN_PP = 1  # a last prompt length, run after P so that P's lines are printed before the tool exits


@dataclass(frozen=True)
class AgentsSpec:
    kv: tuple[str, ...]
    reference: str
    agents: tuple[int, ...]  # B: sequences decoding together
    prefixes: tuple[int, ...]  # P: the prompt's tokens (shared by all B, or each agent's own)
    n_gen: int  # N: tokens each agent generates
    separate: bool = False  # B separate prompts (no -pps -kvu)
    flag_sets: tuple[str, ...] = ("",)
    rounds: int = 1  # the whole scenario this many times; rows are the rounds' medians
    bandwidth: float | str | None = None  # for each row's fraction of it: GB/s, "auto" (measured) or None
    baseline: str = matrix.BASELINE

    @staticmethod
    def make(kv: list[str], reference: str | None, agents: list[int], prefixes: list[int], n_gen: int,
             separate: bool = False, flag_sets: list[str] | None = None, rounds: int = 1,
             bandwidth: str | float | None = None, baseline: str = matrix.BASELINE) -> "AgentsSpec":
        pairs, reference = matrix.kv_pairs(kv, reference, baseline)
        if not agents or any(not 1 <= b <= MAX_AGENTS for b in agents):
            raise BadInput(f"--agents: a list of agent counts from 1 to {MAX_AGENTS}, e.g. 1,4,8,16,32")
        if not prefixes or any(p < 1 for p in prefixes):
            raise BadInput("--prefix: a list of positive prompt lengths in tokens, e.g. 32768,131072")
        if n_gen < 1:
            raise BadInput("-n: each agent must generate at least one token")
        if rounds < 1:
            raise BadInput("--rounds: at least one round")
        spec = AgentsSpec(pairs, reference, tuple(sorted(set(agents))), tuple(sorted(set(prefixes))), n_gen,
                          separate, matrix.check_flag_sets(flag_sets), rounds, matrix.bandwidth_setting(bandwidth),
                          baseline)
        if spec.n_ctx(spec.prefixes[-1]) > MAX_CELLS:
            raise BadInput(f"--prefix {spec.prefixes[-1]} with {spec.agents[-1]} agents needs "
                           f"{spec.n_ctx(spec.prefixes[-1])} KV cells; llama.cpp's context holds at most {MAX_CELLS}")
        return spec

    def n_ctx(self, prefix: int) -> int:
        """The context (-c) a prefix needs at the most agents: N_KV as the tool counts it."""
        most = max(self.agents)
        return most * (prefix + self.n_gen) if self.separate else prefix + most * self.n_gen

    def argv(self, exe: Path, model: Path, pair: str, prefix: int, flags: str) -> list:
        k, v = pair.split("/")
        return [exe, "-m", model, "-ctk", k, "-ctv", v, "-npp", f"{prefix},{DRAIN_PP}", "-ntg", str(self.n_gen),
                "-npl", ",".join(map(str, self.agents)), "-c", str(self.n_ctx(prefix)), *ALWAYS,
                *(() if self.separate else SHARED), *shlex.split(flags)]

    def header(self) -> dict:
        """bench.json's top-level keys before "spec"."""
        return {"scenario": "agents", "reference": self.reference, "baseline": self.baseline}

    def as_dict(self) -> dict:
        return {"kv": list(self.kv), "agents": list(self.agents), "prefixes": list(self.prefixes),
                "n_gen": self.n_gen, "separate": self.separate, "flags": list(self.flag_sets), "rounds": self.rounds}

    @staticmethod
    def from_dict(data: dict) -> "AgentsSpec":
        """From a whole bench.json (before rounds, one round)."""
        s = data["spec"]
        return AgentsSpec(tuple(s["kv"]), data["reference"], tuple(s["agents"]), tuple(s["prefixes"]), s["n_gen"],
                          s["separate"], tuple(s["flags"]), s.get("rounds", 1),
                          baseline=data.get("baseline", matrix.BASELINE))


@dataclass
class AgentRow(matrix.Row):
    """One (kv, flags, prefix, agents) point: llama-batched-bench's numbers and the ratio."""
    kv: str
    flags: str
    prefix: int  # P (PP)
    agents: int  # B
    n_gen: int  # N (TG), per agent
    n_kv: int  # N_KV: cells required, P + B*N shared, B*(P+N) separate
    prompt_s: float  # T_PP s
    prompt_ts: float  # S_PP t/s: P tokens (shared) or B*P (separate) over T_PP
    decode_s: float  # T_TG s
    decode_ts: float  # S_TG t/s: B*N tokens over T_TG, all agents together
    total_ts: float  # S t/s
    ratio: float | None = None  # decode_ts / the reference pair's at the same flags, prefix and B
    baseline_ratio: float | None = None  # decode_ts / the baseline pair's (q8_0/q8_0)
    prompt_ratio: float | None = None  # prompt_ts / the reference pair's: the prefix's prefill
    # with more than one round: the times and speeds above are the rounds' medians, ratio the median of the
    # rounds' ratios (each against the reference of its own round), and these its lowest and highest
    ratio_min: float | None = field(default=None, metadata=matrix.OPTIONAL)
    ratio_max: float | None = field(default=None, metadata=matrix.OPTIONAL)
    # with a bandwidth: the bytes one decode step reads at least (the weights, and every cell of the KV cache
    # once at the step's mean fill), and the fraction of the bandwidth reading them in the step's time would take
    bytes_per_step: int | None = field(default=None, metadata=matrix.OPTIONAL)
    bandwidth_fraction: float | None = field(default=None, metadata=matrix.OPTIONAL)

    @staticmethod
    def measured(kv: str, flags: str, line: dict) -> "AgentRow":
        """A row from one line of llama-batched-bench --output-format jsonl."""
        return AgentRow(kv=kv, flags=flags, prefix=int(line["pp"]), agents=int(line["pl"]), n_gen=int(line["tg"]),
                        n_kv=int(line["n_kv"]), prompt_s=float(line["t_pp"]), prompt_ts=float(line["speed_pp"]),
                        decode_s=float(line["t_tg"]), decode_ts=float(line["speed_tg"]), total_ts=float(line["speed"]))

    def point(self) -> tuple:
        """What the ratio compares across KV pairs."""
        return self.flags, self.prefix, self.agents


@dataclass
class AgentsResult(matrix.BenchResult):
    SPEC = AgentsSpec
    ROW = AgentRow


def parse_jsonl(stdout: str) -> list[dict]:
    """The result lines of llama-batched-bench --output-format jsonl (other lines skipped)."""
    lines = []
    for text in stdout.splitlines():
        if text.lstrip().startswith("{"):
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if isinstance(line, dict) and "speed_tg" in line:
                lines.append(line)
    return lines


def run(exe: Path, model: Path, spec: AgentsSpec, out_dir: Path, *, bandwidth: matrix.MemoryBandwidth | None = None,
        timeout: float = 3600, log: Callable[[str], None] = lambda m: None) -> AgentsResult:
    """The scenario; `bandwidth` (measured by the caller where spec.bandwidth is "auto") adds each row's fraction."""
    if isinstance(spec.bandwidth, float):
        bandwidth = matrix.MemoryBandwidth.of(spec.bandwidth)
    shape = matrix.roofline_shape(model, spec.kv, bandwidth, log)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rounds = [_run_round(exe, model, spec, out_dir, n, timeout, log) for n in range(spec.rounds)]
    rows = rounds[0] if spec.rounds == 1 else median_rows(rounds)
    if shape is not None:
        add_bandwidth_fraction(rows, shape, model.stat().st_size, bandwidth.reference_gbps)
    result = AgentsResult(spec, str(model), rows, round(time.monotonic() - started, 1),
                          bandwidth=bandwidth if shape is not None else None)
    matrix.save(result, out_dir, markdown(result), "decode_vs_agents.png", plot)
    return result


def _run_round(exe: Path, model: Path, spec: AgentsSpec, out_dir: Path, n: int, timeout: float,
               log: Callable[[str], None]) -> list[AgentRow]:
    """Round n: every flag set, prefix and KV pair, with its ratios. The KV pairs run in the opposite order in
    odd rounds, so that a drift of the machine (clocks, heat) does not always favour the same pair."""
    rows: list[AgentRow] = []
    suffix = f"-r{n + 1}" if spec.rounds > 1 else ""
    for flags in spec.flag_sets:
        for prefix in spec.prefixes:
            for pair in (spec.kv if n % 2 == 0 else spec.kv[::-1]):
                what = f"{TOOL} {pair} P={prefix} {flags}".rstrip() + (f" round {n + 1}" if suffix else "")
                log(f"{what} B={','.join(map(str, spec.agents))} -c {spec.n_ctx(prefix)}")
                stdout, log_path = matrix.invoke(spec.argv(exe, model, pair, prefix, flags), out_dir,
                                                 matrix.stem(pair, flags, f"p{prefix}") + suffix, f"{what} failed",
                                                 timeout)
                lines: dict[int, dict] = {}  # B -> P's line (the first: with P = DRAIN_PP the drain's come next)
                for ln in parse_jsonl(stdout):
                    if ln["pp"] == prefix:
                        lines.setdefault(ln["pl"], ln)
                missing = [b for b in spec.agents if b not in lines]
                if missing:
                    raise VerificationFailed(f"{what}: no result for B={','.join(map(str, missing))} (it skips what "
                                             f"its context cannot hold, or lost the line) (log: {log_path})")
                rows += [AgentRow.measured(pair, flags, lines[b]) for b in spec.agents]
    matrix.add_ratios(rows, spec.reference, key=AgentRow.point, value=lambda r: r.decode_ts)
    matrix.add_ratios(rows, spec.baseline, key=AgentRow.point, value=lambda r: r.decode_ts, attr="baseline_ratio")
    matrix.add_ratios(rows, spec.reference, key=AgentRow.point, value=lambda r: r.prompt_ts, attr="prompt_ratio")
    return rows


def add_bandwidth_fraction(rows: list[AgentRow], shape: matrix.KvShape, weight_bytes: int, bandwidth_gbps: float) -> None:
    """Each row's bytes per decode step and the fraction of the bandwidth they take at the step's measured time.
    The weights are the GGUF's size; the cells are N_KV's at the middle of the decode (the shared prefix once,
    since one unified cache holds it once)."""
    for r in rows:
        k, v = r.kv.split("/")
        grown = r.agents * (r.n_gen - 1) / 2  # cells the agents have added, on average over the steps
        cells = (r.n_kv - r.agents * r.n_gen) + grown  # N_KV counts every generated cell
        nbytes = weight_bytes + cells * shape.bytes_per_token(k, v)
        r.bytes_per_step = round(nbytes)
        step_s = r.decode_s / r.n_gen
        r.bandwidth_fraction = round(nbytes / step_s / (bandwidth_gbps * 1e9), 4) if step_s > 0 else None


MEDIAN_FIELDS = ("prompt_s", "prompt_ts", "decode_s", "decode_ts", "total_ts")


def median_rows(rounds: list[list[AgentRow]]) -> list[AgentRow]:
    """One row per (kv, flags, prefix, agents) from several rounds of the same rows: the median of each time and
    speed, the median of the rounds' ratios and their range (the spread a ratio of one round can have)."""
    by_key: dict[tuple, list[AgentRow]] = {}
    for rows in rounds:
        for r in rows:
            by_key.setdefault((r.kv, *r.point()), []).append(r)
    out = []
    for same in by_key.values():
        medians = {name: statistics.median(getattr(r, name) for r in same) for name in MEDIAN_FIELDS}
        ratios = [r.ratio for r in same if r.ratio is not None]
        ratio = dict(ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios)) if ratios else {}
        for name in ("baseline_ratio", "prompt_ratio"):
            values = [getattr(r, name) for r in same if getattr(r, name) is not None]
            ratio[name] = statistics.median(values) if values else None
        out.append(replace(same[0], **medians, **ratio))
    return out


# -- reporting -----------------------------------------------------------------------------
def _mode(spec: AgentsSpec) -> str:
    if spec.separate:
        return "separate prompts: B agents, each its own P-token prompt and KV stream"
    return "shared prefix: B agents over one P-token prefix in a unified KV cache (-pps -kvu)"


COLUMNS = (
    Column("kv", lambda r: r.kv, numeric=False),
    Column("flags", lambda r: r.flags or "-", numeric=False, when=lambda result: result.spec.flag_sets != ("",)),
    Column("prefix", lambda r: str(r.prefix)),
    Column("agents", lambda r: str(r.agents)),
    Column("prompt t/s", lambda r: cell(r.prompt_ts, ".2f")),
    Column("decode t/s", lambda r: cell(r.decode_ts, ".2f")),
    Column("prompt ratio", lambda r: cell(r.prompt_ratio, ".3f")),
    Column("ratio", lambda r: cell(r.ratio, ".3f")),
    Column("ratio range", lambda r: f"{r.ratio_min:.3f}-{r.ratio_max:.3f}" if r.ratio_min is not None else "-",
           when=lambda result: result.spec.rounds > 1),
    Column("vs baseline", lambda r: cell(r.baseline_ratio, ".3f")),
    Column("GB/step", lambda r: cell(None if r.bytes_per_step is None else r.bytes_per_step / 1e9, ".2f"),
           when=lambda result: result.bandwidth is not None),
    Column("of bandwidth", lambda r: cell(r.bandwidth_fraction, ".0%"), when=lambda result: result.bandwidth is not None),
)


def markdown(result: AgentsResult) -> str:
    spec = result.spec
    title = (f"{_mode(spec)}; {spec.n_gen} tokens generated per agent; decode t/s is all agents together; "
             f"ratios are decode t/s (prompt ratio: prompt t/s) over the same of a pair in the same run: "
             f"reference `{spec.reference}` (ratio), baseline `{spec.baseline}` (vs baseline)"
             + (f"; bandwidth {result.bandwidth.describe()}" if result.bandwidth else ""))
    if spec.rounds > 1:
        title += (f"; {spec.rounds} rounds, KV pairs in alternating order: t/s are the rounds' medians, ratio the "
                  f"median of the rounds' ratios, ratio range their lowest and highest")
    rows = sorted(result.rows, key=lambda r: (r.flags, r.prefix, r.agents, r.kv))
    return "\n".join([title, "", *matrix.table(COLUMNS, result, rows)]) + "\n"


def plot(result: AgentsResult, path: Path) -> bool:
    """Decode t/s against B: a panel per KV pair, a line per prefix (and flag set)."""
    if not result.rows:
        return False
    panels: dict[str, matrix.Series] = {pair: {} for pair in result.spec.kv}
    for r in result.rows:
        label = f"P={r.prefix}" + (f" {r.flags}" if r.flags else "")
        panels[r.kv].setdefault(label, []).append((r.agents, r.decode_ts))
    mode = "separate prompts" if result.spec.separate else "shared prefix"
    matrix.line_plot(path, panels, title=f"decode t/s of B agents ({mode}, reference {result.spec.reference})",
                     xlabel="agents (B)", ylabel="decode t/s, all agents", xticks=list(result.spec.agents))
    return True
