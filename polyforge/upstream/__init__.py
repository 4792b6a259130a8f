"""Upstream: the pinned llama.cpp and the vendored tree made from it.

  pin.py            vendor/pin.yaml: release, commit, tree ids, sources (validated dataclasses)
  source.py         source kinds: where the pinned tree's files come from (PyPI sdist, git, ...)
  vendor.py         fetch a source into vendor/llama.cpp and prove its tree id; pack it
  vendored_tree.py  the vendored git repository: baseline commit, one commit per applied patch
"""
