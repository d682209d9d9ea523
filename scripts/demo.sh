#!/usr/bin/env bash
# The embedded demo: a tiny FiD reader trained from scratch on the synthetic world,
# then evaluated on held-out questions and used to score passages. About 5 minutes on 2 cores.
#   bash scripts/demo.sh [OUTPUT_DIR]      (default: demo/)
set -euo pipefail
out=${1:-demo}
cfg=config/demo
threads=${FID_THREADS:-$(nproc)}
fid() { command fid --threads "$threads" "$@"; }

fid make-demo-data --config $cfg/world.yaml --output "$out/data"
fid init-reader --config $cfg/init.yaml --corpus "$out/data/passages.tsv" "$out/data/reader/train.json" \
    --output "$out/init"
fid train-reader --config $cfg/reader.yaml --train "$out/data/reader/train.json" \
    --dev "$out/data/reader/dev.json" --init-model "$out/init" --output "$out/reader" \
    --state-dir "$out/state/reader"
fid eval-reader --config $cfg/eval.yaml --model "$out/reader" --questions "$out/data/reader/test.json" \
    --predictions "$out/eval/test.predictions.jsonl" --metrics "$out/eval/test.metrics.json"
fid score-passages --config $cfg/score.yaml --model "$out/reader" \
    --questions "$out/data/reader/test.json" --output "$out/scores/test.json"
echo
echo "Test exact match (reader):    $(python -c "import json;print(round(json.load(open('$out/eval/test.metrics.json'))['exact_match'],1))")%"
python - "$out" <<'PY'
import json, sys
from collections import Counter
out = sys.argv[1]
train = json.load(open(f"{out}/data/reader/train.json"))
test = json.load(open(f"{out}/data/reader/test.json"))
# The most common training answer, predicted for every test question: the bar to beat.
common = Counter(a for r in train for a in r["answers"][:1]).most_common(1)[0][0]
baseline = sum(common in r["answers"] for r in test) / len(test)
scored = json.load(open(f"{out}/scores/test.json"))
top_is_gold = sum(
    max(r["ctxs"], key=lambda c: c["reader_score"] if c["reader_score"] is not None else -1e9)["id"]
    == r["gold_passage_id"] for r in scored) / len(scored)
print(f"Most-common-answer baseline:  {100 * baseline:.1f}%")
print(f"Reader's top-scored passage is the gold one: {100 * top_is_gold:.1f}% "
      f"(chance: {100 / len(scored[0]['ctxs']):.1f}%)")
PY
