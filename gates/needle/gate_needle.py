#!/usr/bin/env python3
"""Needles in a haystack: long-context retrieval through quantized K/V caches.

A haystack of about --tokens tokens (the paragraphs of --text, repeated) holds --needles
needles at evenly spread depths, each a sentence "The access code of NAME is DIGITS." with a
name and a 5-digit code drawn from --seed. For each K/V configuration one llama-server
(--parallel 1, flash attention) processes the haystack once; each needle is then asked as a
completion of that same prefix, "... The access code of NAME is", so the server's prompt
cache reuses the haystack and only the question is new. A needle is retrieved when the
greedy continuation's first number is its code.

Prints one JSON object: ok (every server answered), tokens (the haystack's length), needles,
and per configuration ("f16/f16": {...}) found (needles retrieved), missed (their names),
prefill_s (the haystack's prompt processing) and answers (what each question got). The
gate's thresholds compare configurations with f16/f16.
"""

from __future__ import annotations

import argparse
import random
import re
import shlex
import sys
import tempfile
from pathlib import Path

from polyforge.errors import VerificationFailed
from polyforge.gates.server import LlamaServer, program_log, run_program

NAMES = ["Aldous", "Beatrix", "Casimir", "Dagny", "Evander", "Fenella", "Gideon", "Hortense",
         "Ignatius", "Juniper", "Leopold", "Marisol", "Nikolai", "Ottilie", "Percival", "Rosalind"]
FIRST_NUMBER = re.compile(r"\d+")


def make_needles(count: int, seed: int) -> list[tuple[str, str]]:
    if not 1 <= count <= len(NAMES):
        raise SystemExit(f"--needles must be 1..{len(NAMES)}")
    rng = random.Random(seed)
    codes = rng.sample(range(10000, 100000), count)
    return [(name, str(code)) for name, code in zip(rng.sample(NAMES, count), codes)]


def make_haystack(paragraphs: list[str], needles: list[tuple[str, str]], n_paragraphs: int) -> str:
    """n_paragraphs paragraphs (the text's, repeated), needle k after paragraph (k+1)*n/(N+1)."""
    body = [paragraphs[i % len(paragraphs)] for i in range(n_paragraphs)]
    for k, (name, code) in reversed(list(enumerate(needles))):
        at = (k + 1) * n_paragraphs // (len(needles) + 1)
        body.insert(at, f"The access code of {name} is {code}.")
    return "\n\n".join(body)


def fit_haystack(server: LlamaServer, paragraphs: list[str], needles, target_tokens: int) -> tuple[str, int]:
    """The haystack with the most paragraphs whose token count stays within target_tokens."""
    per_paragraph = len(server.tokenize("\n\n".join(paragraphs), add_special=False)) / len(paragraphs)
    n = max(len(needles) + 1, int(target_tokens / per_paragraph))
    while True:
        text = make_haystack(paragraphs, needles, n)
        tokens = len(server.tokenize(text, add_special=True))
        if tokens <= target_tokens or n <= len(needles) + 1:
            return text, tokens
        n = max(len(needles) + 1, int(n * target_tokens / tokens) - 1)


def ask(server: LlamaServer, haystack: str, name: str, timeout: float) -> tuple[str, float]:
    """The greedy continuation of 'haystack + question' and its prompt processing time (s)."""
    body = {"prompt": f"{haystack}\n\nThe access code of {name} is", "n_predict": 8, "temperature": 0.0,
            "top_k": 1, "cache_prompt": True, "samplers": ["top_k"]}
    status, reply = server.post_json("/completion", body, timeout=timeout)
    if status != 200:
        raise VerificationFailed(f"/completion returned {status}: {str(reply)[:300]}")
    return reply["content"], reply.get("timings", {}).get("prompt_ms", 0.0) / 1000.0


def check(args) -> dict:
    paragraphs = [p.strip() for p in Path(args.text).read_text().split("\n\n") if len(p.strip()) > 40]
    needles = make_needles(args.needles, args.seed)
    result: dict = {"ok": False, "needles": len(needles)}
    haystack = None
    with tempfile.TemporaryDirectory(prefix="needle-") as tmp:
        for config in args.kv:
            type_k, type_v = config.split("/")
            flags = ["-c", str(args.tokens + 64), "--parallel", "1", "-fa", "on", "-ctk", type_k, "-ctv", type_v,
                     "-b", "2048", "-ub", "512", *shlex.split(args.extra_args)]
            log = Path(args.log_dir or tmp) / f"server-{type_k}-{type_v}.log"
            program_log(f"{config}: starting llama-server ({log})")
            with LlamaServer(args.server, args.model, flags, log) as server:
                server.wait_healthy(args.health_timeout)
                if haystack is None:
                    haystack, tokens = fit_haystack(server, paragraphs, needles, args.tokens - 16)
                    result["tokens"] = tokens
                    program_log(f"haystack: {tokens} tokens, {len(needles)} needles")
                answers, found, missed, prefill = {}, 0, [], 0.0
                for i, (name, code) in enumerate(needles):
                    content, prompt_s = ask(server, haystack, name, args.request_timeout)
                    if i == 0:
                        prefill = prompt_s
                    number = FIRST_NUMBER.search(content)
                    answers[name] = content.strip()
                    if number is not None and number.group(0) == code:
                        found += 1
                    else:
                        missed.append(name)
                result[config] = {"found": found, "missed": missed, "prefill_s": round(prefill, 2), "answers": answers}
                program_log(f"{config}: {found}/{len(needles)} found, haystack prefill {prefill:.1f} s")
    result["ok"] = True
    return result


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="llama-server binary")
    parser.add_argument("--model", required=True)
    parser.add_argument("--text", required=True, help="the haystack's paragraphs (blank-line separated)")
    parser.add_argument("--kv", action="append", required=True, help="K/V pair TYPE_K/TYPE_V (repeatable)")
    parser.add_argument("--tokens", type=int, default=16384, help="context size the haystack fills (default 16384)")
    parser.add_argument("--needles", type=int, default=8, help="needles in the haystack (default 8)")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--extra-args", default="", help="more llama-server arguments, one string")
    parser.add_argument("--health-timeout", type=float, default=300)
    parser.add_argument("--request-timeout", type=float, default=3600)
    parser.add_argument("--log-dir", help="keep the server logs here (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print the verdict as one line")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    run_program(lambda: check(args), args.json)


if __name__ == "__main__":
    sys.exit(main())
