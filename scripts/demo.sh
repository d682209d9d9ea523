#!/usr/bin/env bash
# The embedded demo: a tiny FiD reader trained from scratch on the synthetic world (a two-stage
# curriculum), evaluated on held-out test questions, then used to score passages.
# About 4 minutes on 2 cores.   Usage: bash scripts/demo.sh [OUTPUT_DIR]   (default: demo/)
set -euo pipefail
out=${1:-demo}
cfg=config/demo
threads=${FID_THREADS:-$(nproc)}
fid() { command fid --threads "$threads" "$@"; }

fid make-demo-data --config $cfg/world_gold.yaml --output "$out/data_gold"
fid make-demo-data --config $cfg/world.yaml --output "$out/data"
fid init-reader --config $cfg/init.yaml --corpus "$out/data/passages.tsv" "$out/data/reader/train.json" \
    --output "$out/init"
fid train-reader --config $cfg/reader_gold.yaml --train "$out/data_gold/reader/train.json" \
    --dev "$out/data_gold/reader/dev.json" --init-model "$out/init" --output "$out/reader_gold" \
    --state-dir "$out/state/reader_gold"
fid train-reader --config $cfg/reader.yaml --train "$out/data/reader/train.json" \
    --dev "$out/data/reader/dev.json" --init-model "$out/reader_gold" --output "$out/reader" \
    --state-dir "$out/state/reader"
fid eval-reader --config $cfg/eval.yaml --model "$out/reader" --questions "$out/data/reader/test.json" \
    --predictions "$out/eval/test.predictions.jsonl" --metrics "$out/eval/test.metrics.json"
fid score-passages --config $cfg/score.yaml --model "$out/reader" \
    --questions "$out/data/reader/test.json" --output "$out/scores/test.json"
python scripts/demo_summary.py "$out"
