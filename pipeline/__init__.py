"""Model-preparation build pipeline for llama.cpp."""
__version__ = "0.1.0"
