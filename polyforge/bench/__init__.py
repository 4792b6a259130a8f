"""Benchmarks: matrix.py runs a llama-bench matrix (KV types x depths x flag sets) and reports
ratios against a reference in the same run; its docstring says how to add a metric."""
