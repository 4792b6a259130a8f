"""Building the patched tree.

  builder.py    build options, keyed build directories, the manifest of what was built
  cmake.py      the cmake/ninja wrapper (tools from PyPI)
  toolchain.py  compilers, nvcc and cuBLAS, ccache, GPUs: probed once for build and doctor
  doctor.py     what this machine has for building and gating, each ok or missing
"""
