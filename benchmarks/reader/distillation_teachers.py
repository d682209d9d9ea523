"""What each retriever teacher of `fid score-passages` costs: questions per CPU-second.

    python benchmarks/reader/distillation_teachers.py                    # d_model 256, 4+4 layers
    python benchmarks/reader/distillation_teachers.py --d-model 512 --layers 6 --length 250

The attention scores (FiD-KD's `mean_logit`, `attention_mass`) need one encoding and one
decoding step a question; Atlas's PDist decodes the answer from each of the N passages alone
(N single-passage inputs, batched), LOOP from the fused encoding with each passage masked (N
masked copies, the encoding computed once). Random weights (the cost does not depend on them),
one thread, fp32, one question a batch as `score-passages` feeds them; CPU seconds from
time.process_time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `benchmarks.*` from anywhere

from benchmarks.harness import record, table_header, table_row, timed, write_record  # noqa: E402
from fid.models.reader import FiDReader  # noqa: E402


def _reader(d_model: int, layers: int) -> FiDReader:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=32128, d_model=d_model, d_ff=4 * d_model, d_kv=64,
                      num_heads=d_model // 64, num_layers=layers, dropout_rate=0.0,
                      decoder_start_token_id=0)  # fmt: skip
    return FiDReader(T5ForConditionalGeneration(config), encoder_buckets=1).eval()


def _cost(reader: FiDReader, mode: str, n: int, length: int, answer: int, questions: int):
    torch.manual_seed(0)
    ids = torch.randint(3, 32000, (1, n, length))
    mask = torch.ones_like(ids)
    labels = torch.randint(3, 32000, (1, answer))
    score = {
        "mean_logit": lambda: reader.passage_scores(ids, mask, "mean_logit"),
        "attention_mass": lambda: reader.passage_scores(ids, mask, "attention_mass"),
        "pdist": lambda: reader.answer_log_likelihoods(ids, mask, labels),
        "loop": lambda: reader.leave_one_out_log_likelihoods(ids, mask, labels),
    }[mode]
    with torch.no_grad():
        score()  # warm-up
        with timed() as clock:
            for _ in range(questions):
                score()
    return questions / clock.cpu_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--length", type=int, default=100, help="tokens a passage")
    parser.add_argument("--answer", type=int, default=6, help="answer tokens (EOS included)")
    parser.add_argument("--passages", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--questions", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    reader = _reader(args.d_model, args.layers)
    modes = ["mean_logit", "attention_mass", "pdist", "loop"]
    print(f"d_model {args.d_model}, {args.layers}+{args.layers} layers, {args.length} tokens a "
          f"passage, {args.answer}-token answers, one thread, fp32")  # fmt: skip
    columns = ["N", *modes, "pdist / mean_logit", "loop / mean_logit"]
    print(table_header(columns, align="r" * len(columns)))
    rows = []
    for n in args.passages:
        rates = {m: _cost(reader, m, n, args.length, args.answer, args.questions) for m in modes}
        rows.append({"n_passages": n, "questions_per_cpu_s": rates})
        cells = [n, *(f"{rates[m]:.3f}" for m in modes)]
        cells += [f"{rates['mean_logit'] / rates[m]:.1f}x slower" for m in ("pdist", "loop")]
        print(table_row(cells), flush=True)
    print("(questions per CPU-second)")
    if args.json:
        write_record(args.json, record(__file__, rows))


if __name__ == "__main__":
    main()
