"""The patch chain on the vendored tree, and its proofs.

  patchfile.py  one patch file: strict reading and the canonical writer
  engine.py     the chain: discovery in lexical order, apply/unapply/capture/refresh/relock
  lockfile.py   patches/chain.lock: the tree id after each patch
  verify.py     verify-patches: reverse, forward and lock proofs on scratch indexes
  status.py     the vendored tree against the pin and the chain
"""
