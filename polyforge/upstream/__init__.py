"""Upstream: the pinned llama.cpp and the vendored tree made from it. Imports nothing from
chain/, which builds on it (tests/test_layers.py keeps it so).

  pin.py            vendor/pin.yaml: release, commit, tree ids, sources (validated dataclasses)
  source.py         source kinds: where the pinned tree's files come from (PyPI sdist, git, ...)
  vendor.py         fetch a source into vendor/llama.cpp and prove its tree id; pack it
  vendored_tree.py  the vendored git repository: baseline commit, one commit per applied patch
  workspace.py      a project's pin and vendored tree under the project lock; what vendoring
                    asks of the chain, answered by chain.engine.Chain
"""
