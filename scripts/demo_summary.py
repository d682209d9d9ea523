"""Prints the demo's figures: reader EM against the most-common-answer baseline, and how often
the reader's top-scored passage is the gold one."""

import json
import sys
from collections import Counter
from pathlib import Path

out = Path(sys.argv[1])


def load(path):
    return json.loads((out / path).read_text())


train = load("data/reader/train.json")
test = load("data/reader/test.json")
metrics = load("eval/test.metrics.json")
common = Counter(r["answers"][0] for r in train).most_common(1)[0][0]
baseline = 100 * sum(common in r["answers"] for r in test) / len(test)
scored = load("scores/test.json")
gold_on_top = (
    100
    * sum(
        max(r["ctxs"], key=lambda c: c["reader_score"])["id"] == r["gold_passage_id"]
        for r in scored
    )
    / len(scored)
)
print(f"test exact match: {metrics['exact_match']:.1f}% (most common answer: {baseline:.1f}%)")
print(
    f"reader's top-scored passage is the gold one: {gold_on_top:.1f}% "
    f"(chance: {100 / len(scored[0]['ctxs']):.1f}%)"
)
