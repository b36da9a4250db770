"""What a target device needs of a GGUF: :mod:`pipeline.memory` predicts the memory llama.cpp's CPU build
takes to run it (``ggufpipe fit``). Standard library and the project's GGUF reader only (a small device install)."""
