"""Gate kinds: what a gate's `kind:` names, and how to add one.

A gate (gates/NAME.yaml, read by polyforge.gates.runner) says which kind runs it. A kind is
an object with the two functions of `GateKind` below; each kind here is a module of this
package (pre-commit's `languages` style), registered by name in `KINDS`. The runner does
everything else: the YAML schema around `params`, the build and models, the work folder,
the timing, judging the thresholds and the verdict (runner.Verdict).

To add a kind, say `llama-bench`:

1. Write polyforge/gates/llama_bench.py. Its docstring says what it runs, then a `params:`
   paragraph (each with its default) and a `metrics:` one: that docstring is the kind's user
   documentation (a test checks both paragraphs are there). It defines:

   validate_params(params, where, models) -> dict
       Check the gate's `params:` mapping ({} when absent) and return it normalised, with
       every default filled in: the result is `gate.params`, which `run` reads without
       checking again. Read fields with polyforge.schema, passing section="params" so an
       error names the key as the file spells it:
           schema.only(params, {"model", "reps"}, where, section="params")
           reps = schema.optional(params, "reps", int, where, 5, section="params")
       A model the kind uses must be in the gate's `models` list (so it is fetched first):
       _common.need_model(params, where, models) checks both. Raise BadInput(f"{where}: ...")
       for anything else wrong; it is one line and exit 2, before any build.

   run(ctx) -> dict
       Run the gate and return its metrics. `ctx` is a runner.GateContext: ctx.bin(NAME)
       (a binary of the build: list it in the gate's build.targets), ctx.model(NAME),
       ctx.data(PATH) (under gates/), ctx.substitute(ARG) ({bin:..} {model:..} {data:..}
       {root} {gates} {build} {work} in an argument), ctx.work_dir (logs go here),
       ctx.gate.timeout (seconds per command), ctx.env (pass it to every command), ctx.log.
       Run commands with _common.run_logged, which keeps each command's output in a log
       and turns a hang (proc.TimedOut) into a failure of the gate. When a command fails,
       call ctx.note_failed_command(done): should the gate then fail, the verdict's `error`
       and `output_tail` show that command's last lines.

   Metrics are JSON values. A flat metric (`passed: 3`) is read in a threshold as `passed`;
   a configuration's metrics go in a mapping under its name (`"q8_0/q4_0": {"kld_mean": ..}`)
   and are read as `[q8_0/q4_0].kld_mean`. The gate passes only when all of its YAML
   `thresholds` hold over the metrics (runner's docstring has the expression language); a
   metric the run did not produce fails every threshold that reads it, so leave a metric
   out rather than inventing a value. Report exit statuses as metrics (`exit_code`) and let
   thresholds judge them.

   Errors, by type: raise VerificationFailed when the gate cannot produce its metrics (a
   binary crashed, a server never became healthy): the verdict is ok false, exit 1, with
   the message as its `error`. EnvironmentProblem (a missing tool) gives exit 3 the same
   way. BadInput propagates: the gate's files are wrong, and that is no verdict at all.

2. Register it below: `"llama-bench": llama_bench,` in KINDS. The name is what gates write
   under `kind:`; an unknown name is refused listing these keys.

3. Test it in tests/gates/test_runner.py: a rejected-params case in
   test_kind_params_are_validated, and a run against a fake binary (buildkit.fake_build,
   then pipeline.run_gate on a gate written by _gate) asserting on the verdict's metrics.
   A gates/*.yaml using the kind is loaded by test_the_repository_gates_load and, when it
   applies to CPU builds, run for real by the slow test_real_gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from . import backend_ops, command, perplexity_kld, server

if TYPE_CHECKING:
    from .runner import GateContext

Metrics = dict[str, Any]


class GateKind(Protocol):
    """What a gate kind provides (a module with these two functions is one)."""

    def validate_params(self, params: dict, where: str, models: tuple[str, ...]) -> dict:
        """The gate's params checked and normalised (defaults filled in); BadInput when wrong."""
        ...

    def run(self, ctx: GateContext) -> Metrics:
        """Run the gate in its context and return its metrics."""
        ...


KINDS: dict[str, GateKind] = {
    "backend-ops": backend_ops,
    "command": command,
    "perplexity-kld": perplexity_kld,
    "server": server,
}
