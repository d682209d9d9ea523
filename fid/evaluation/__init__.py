"""The commands that use a trained run end to end: the `eval-*` commands (a reader's answers,
retrieved lists and the most-common-answer baseline scored against gold answers; the metrics
themselves are in fid.metrics) and `fid ask` (a run's retriever, index and reader answer a
typed question)."""
