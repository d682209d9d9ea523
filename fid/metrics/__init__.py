"""Metrics, in pure Python (no torch): SQuAD-normalized exact match and F1, DPR's has-answer
rule and top-k retrieval accuracy, all reported in percent."""
