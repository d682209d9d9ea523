"""Fusion-in-Decoder open-domain QA and reader-to-retriever distillation."""

__version__ = "0.1.0"
