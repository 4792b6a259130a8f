"""The patch chain on the vendored tree, and its proofs; built on upstream/.

  patchfile.py    one patch file: strict reading and the canonical writer
  engine.py       the chain (a Workspace with patches): discovery in lexical order,
                  apply/unapply/capture/refresh/relock
  lockfile.py     patches/chain.lock: the tree id after each patch
  verify.py       verify-patches: reverse, forward and lock proofs on scratch indexes
  status.py       the vendored tree against the pin and the chain
  queue.py        fold, move and rename, proven and journalled
  transaction.py  the journal that makes a chain-changing command all or nothing
  report.py       the chain report
  rebase.py       carry the chain onto another upstream tree; upstream check
  review.py       the review of a carried patch: far hunks, look-alike context, the interdiff
"""
