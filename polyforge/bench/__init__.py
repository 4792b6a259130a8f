"""Benchmarks: matrix.py runs a llama-bench matrix (KV types x depths x flag sets) and reports
ratios against a reference in the same run; agents.py runs the agents scenario (B agents sharing
a P-token prefix, llama-batched-bench) on the same reporting pieces. Their docstrings say how to
add a metric."""
