"""polyforge: a build orchestrator and patch-chain manager for llama.cpp."""

__version__ = "0.1.0"
