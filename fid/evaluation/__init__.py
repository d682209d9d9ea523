"""The `eval-*` commands: a reader's answers, retrieved lists and the most-common-answer
baseline scored against gold answers (the metrics themselves are in fid.metrics)."""
