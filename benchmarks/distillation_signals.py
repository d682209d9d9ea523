"""Which signal teaches the retriever best: one reader, four teachers, two objectives.

    python benchmarks/distillation_signals.py                      # demo world + squad-open-tiny
    python benchmarks/distillation_signals.py --data demo --small  # the test's size (~1-2 min)

On each data set: one small reader is trained (`fid train-reader`); `fid score-passages` scores
its train and dev lists with each teacher (`mode`: mean_logit, attention_mass, pdist, loop); a
retriever is distilled from each (`objective: kl`) plus one with `objective: emdr2` on the pdist
scores (EMDR2 reads `reader_score` as log p(a | q, k), which pdist writes), each with the
training seeds --seeds; each retriever embeds the corpus, and retrieves for the same held-out
questions (`fid embed-passages`, `build-index`, `retrieve`). A question's top-k score is 1 when
one of its first k passages holds an answer (fid's DPR has-answer rule); it is averaged over
the seeds first, then over questions. The table gives the mean top-1/5/20 (percent) and the
paired bootstrap 95% interval (fid.evaluation.bootstrap) of each signal's difference against
mean_logit over questions. Scoring cost: `benchmarks/distillation_teachers.py`; here the CPU
seconds of each score-passages run are printed as questions per CPU-second.

Data sets: "demo" (`fid make-demo-data`: the reader lists hold the gold passage and 3 of the
same entity; held out: the test questions over the whole corpus) and "squad"
(samples/squad-open-tiny: BM25 top-`n` lists for all 200 questions; held out: every 4th
question, dev: every 8th of the rest, train: the others). Everything runs on one thread.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fid.evaluation.bootstrap import paired_bootstrap_interval  # noqa: E402
from fid.metrics.has_answer import AnswerMatcher  # noqa: E402

SIGNALS = ["mean_logit", "attention_mass", "pdist", "loop", "pdist+emdr2"]
KS = (1, 5, 20)


def _fid(*args) -> float:
    """Runs `python -m fid --threads 1 ARGS`; returns its CPU seconds (children's)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, "-m", "fid", "--threads", "1", *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _yaml(path: Path, values: dict) -> Path:
    path.write_text(yaml.safe_dump(values))
    return path


def _sizes(small: bool) -> dict:
    if small:
        return dict(entities=16, facts=16, reader_steps=60, retriever_steps=20, d_model=32,
                    hidden=32, passages=4, batch=16)  # fmt: skip
    return dict(entities=40, facts=40, reader_steps=300, retriever_steps=100, d_model=64,
                hidden=64, passages=5, batch=32)  # fmt: skip


def _demo_data(out: Path, size: dict) -> dict:
    data = out / "data"
    if not (data / "passages.tsv").is_file():
        _fid("make-demo-data", "--config", _yaml(out / "world.yaml", dict(
            seed=0, n_entities=size["entities"], n_dev_facts=size["facts"] // 2,
            n_test_facts=size["facts"], train_paraphrases=1, n_passages=size["passages"])),
            "--output", data)  # fmt: skip
    return dict(passages=data / "passages.tsv", train=data / "reader/train.json",
                dev=data / "reader/dev.json", heldout=data / "test.jsonl")  # fmt: skip


def _squad_data(out: Path, size: dict) -> dict:
    sample = ROOT / "samples/squad-open-tiny"
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    passages = sample / "psgs_w100.tsv"
    ranked = data / "all.json"
    if not ranked.is_file():
        _fid("build-bm25", "--passages", passages, "--output", out / "bm25")
        _fid("retrieve-bm25", "--config", _yaml(out / "bm25.yaml", dict(top_k=size["passages"])),
             "--index", out / "bm25", "--passages", passages, "--questions",
             sample / "questions.jsonl", "--output", ranked)  # fmt: skip
    records = json.loads(ranked.read_text())
    splits = {"heldout": [], "dev": [], "train": []}
    for i, record in enumerate(records):
        split = "heldout" if i % 4 == 0 else "dev" if i % 8 == 1 else "train"
        splits[split].append(record)
    paths = {"passages": passages}
    for split, rows in splits.items():
        paths[split] = data / f"{split}.json"
        paths[split].write_text(json.dumps(rows))
    return paths


def _hits(retrieved: Path, texts: dict[str, str]) -> np.ndarray:
    """(Q, len(KS)) 0/1: an answer in the first k passages (fid's has-answer rule)."""
    rows = []
    for record in json.loads(retrieved.read_text()):
        matcher = AnswerMatcher(record.get("answers") or record.get("answer") or [])
        found = [matcher.matches(c.get("text") or texts[str(c["id"])]) for c in record["ctxs"]]
        rows.append([float(any(found[:k])) for k in KS])
    return np.array(rows)


def _passage_texts(path: Path) -> dict[str, str]:
    texts = {}
    with path.open(encoding="utf-8") as f:
        next(f)
        for line in f:
            fields = line.rstrip("\n").split("\t")
            texts[fields[0]] = fields[1].strip('"')
    return texts


def run(name: str, out: Path, small: bool, seeds: list[int]) -> tuple[dict, dict]:
    """Per-signal (seeds, Q, len(KS)) hits and questions per CPU-second of each teacher."""
    size = _sizes(small)
    out.mkdir(parents=True, exist_ok=True)
    paths = (_demo_data if name == "demo" else _squad_data)(out, size)
    n = size["passages"]
    corpus = [paths["passages"], paths["train"]]
    if not (out / "init_reader/config.json").is_file():
        _fid("init-reader", "--config", _yaml(out / "init_reader.yaml", dict(
            seed=0, vocab_size=1000, d_model=size["d_model"], d_ff=4 * size["d_model"], d_kv=16,
            num_layers=2, num_decoder_layers=2, num_heads=4, dropout_rate=0.0)),
            "--corpus", *corpus, "--output", out / "init_reader")  # fmt: skip
    if not (out / "init_retriever/config.json").is_file():
        _fid("init-retriever", "--config", _yaml(out / "init_retriever.yaml", dict(
            vocab_size=1000, hidden_size=size["hidden"], num_layers=2, num_heads=4,
            intermediate_size=4 * size["hidden"])), "--corpus", *corpus,
            "--output", out / "init_retriever")  # fmt: skip
    reader = out / "reader"
    if not (reader / "config.json").is_file():
        _fid("train-reader", "--config", _yaml(out / "reader.yaml", dict(
            n_passages=n, passage_max_tokens=96, batch_size_per_device=8,
            max_steps=size["reader_steps"], lr=1e-3, warmup_steps=20,
            eval_every_steps=size["reader_steps"], save_every_steps=size["reader_steps"],
            log_every_steps=50, eval_batch_size=32, max_new_tokens=8, tensorboard=False,
            precision="fp32", activation_checkpointing=False, encoder_buckets=1)),
            "--train", paths["train"], "--dev", paths["dev"], "--init-model",
            out / "init_reader", "--output", reader, "--state-dir", out / "state-reader")  # fmt: skip
    rates = {}
    for mode in SIGNALS[:4]:
        seconds, questions = 0.0, 0
        for split in ("train", "dev"):
            scored = out / f"scored-{mode}-{split}.json"
            if not scored.is_file():
                seconds += _fid("score-passages", "--config", _yaml(out / f"score-{mode}.yaml",
                                dict(n_passages=n, batch_size=1, mode=mode, precision="fp32")),
                                "--model", reader, "--questions", paths[split],
                                "--output", scored)  # fmt: skip
                questions += len(json.loads(paths[split].read_text()))
        rates[mode] = questions / seconds if seconds else float("nan")
    texts = _passage_texts(paths["passages"])
    hits = {}
    for signal in SIGNALS:
        mode, objective = (signal.split("+") + ["kl"])[:2]
        per_seed = []
        for seed in seeds:
            tag = f"{signal}-{seed}"
            retrieved = out / f"retrieved-{tag}.json"
            if not retrieved.is_file():
                model = out / f"retriever-{tag}"
                config = dict(
                    seed=seed, objective=objective, n_passages=n, in_batch_negatives=True,
                    retriever_temperature=0.05, question_max_tokens=24, passage_max_tokens=80,
                    batch_size_per_device=size["batch"], max_steps=size["retriever_steps"],
                    lr=3e-3, warmup_steps=size["retriever_steps"] // 4, eval_k=[1],
                    select_on="candidate_answer_recall@1",
                    eval_every_steps=size["retriever_steps"] // 2,
                    save_every_steps=size["retriever_steps"] // 2, log_every_steps=25,
                    precision="fp32", tensorboard=False)  # fmt: skip
                if objective == "kl":
                    # attention mass lies in [0, 1] (the workflow's 0.1); logits and
                    # log-likelihoods spread wider: 1
                    config["reader_temperature"] = 0.1 if mode == "attention_mass" else 1.0
                _fid("train-retriever", "--config", _yaml(out / f"retriever-{tag}.yaml", config),
                     "--train", out / f"scored-{mode}-train.json", "--dev",
                     out / f"scored-{mode}-dev.json", "--init-model", out / "init_retriever",
                     "--output", model, "--state-dir", out / f"state-{tag}")  # fmt: skip
                _fid("embed-passages", "--config", _yaml(out / "embed.yaml", dict(
                    precision="fp32")), "--model", model, "--passages", paths["passages"],
                    "--output", out / f"shard-{tag}")  # fmt: skip
                _fid("build-index", "--shards", out / f"shard-{tag}", "--output",
                     out / f"index-{tag}")  # fmt: skip
                _fid("retrieve", "--config", _yaml(out / "retrieve.yaml", dict(
                    top_k=max(KS), precision="fp32")), "--model", model, "--index",
                    out / f"index-{tag}", "--passages", paths["passages"], "--questions",
                    paths["heldout"], "--output", retrieved)  # fmt: skip
            per_seed.append(_hits(retrieved, texts))
        hits[signal] = np.stack(per_seed)
    return hits, rates


def table(hits: dict[str, np.ndarray]) -> list[str]:
    """Markdown rows: mean top-k over seeds and questions (percent), and the paired bootstrap
    95% interval of the difference against mean_logit (per-question scores averaged over the
    seeds first)."""
    base = hits["mean_logit"].mean(0)  # (Q, len(KS))
    head = (
        " | ".join(f"top-{k}" for k in KS)
        + " | "
        + " | ".join(f"Δ top-{k} vs mean_logit [95% CI]" for k in KS)
    )
    rows = [f"| signal | {head} |", "|---|" + "---:|" * (2 * len(KS))]
    for signal, h in hits.items():
        mine = h.mean(0)
        means = " | ".join(f"{100 * mine[:, j].mean():.1f}" for j in range(len(KS)))
        diffs = []
        for j in range(len(KS)):
            if signal == "mean_logit":
                diffs.append("—")
                continue
            low, high = paired_bootstrap_interval(mine[:, j], base[:, j])
            diff = mine[:, j].mean() - base[:, j].mean()
            diffs.append(f"{100 * diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]")
        rows.append(f"| {signal} | {means} | {' | '.join(diffs)} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", choices=["demo", "squad"], default=["demo", "squad"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--small", action="store_true", help="the test's size (~1-2 min)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs/distillation_signals",
                        help="work folder (finished steps are reused)")  # fmt: skip
    args = parser.parse_args()
    for name in args.data:
        started = time.time()
        hits, rates = run(name, args.out / name, args.small, args.seeds)
        q = len(next(iter(hits.values()))[0])
        print(f"\n{name}: {q} held-out questions, seeds {args.seeds}, "
              f"{time.time() - started:.0f} s wall")  # fmt: skip
        print("\n".join(table(hits)), flush=True)
        cells = ", ".join(f"{m} {r:.1f}" for m, r in rates.items())
        print(f"scoring (questions per CPU-second, whole score-passages runs): {cells}")


if __name__ == "__main__":
    main()
