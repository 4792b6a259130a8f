"""Models for gates and benchmarks.

  registry.py     registered PyPI models and random:SHAPE models: fetch, check, cache
  gguf.py         a GGUF file's metadata, for shape facts
  random_gguf.py  write a random-weight llama GGUF (python -m polyforge.models.random_gguf)
"""
