"""Which signal teaches the retriever best, each read against two no-teacher controls.

    python benchmarks/reader/distillation_signals.py --data squad           # the measured set-up
    python benchmarks/reader/distillation_signals.py --data demo --small    # the test's size

On each data set one small reader is trained (`fid train-reader`); `fid score-passages` scores
its train and dev lists with each teacher; a retriever is distilled from each (`fid
train-retriever`), embeds the corpus, and retrieves for the held-out and dev questions (`fid
embed-passages`, `build-index`, `retrieve`). The rows:

- teachers, each at the `reader_temperature` that retrieves best on the dev questions among a
  sweep of five (SHARP, SUMMED; --small: the middle two): mean_logit, attention_mass, pdist and loop, the last two under both
  `answer_log_likelihood` conventions ("sum", the default; "mean", Atlas's per-token one:
  rows pdist_mean, loop_mean), and pdist + emdr2 (EMDR2 reads the likelihoods as they are);
- controls: "uniform" (score mode uniform: the same candidates, in-batch negatives, steps and
  seeds, a flat target, no reader information) and "in_batch" (uniform scores and
  `train_n_passages: 1`: a training question's one positive is its list's top passage, the
  batch's other questions' positives its negatives; DPR's loss with no candidates).

A temperature's dev score: top-1/5/20 over the whole corpus (a question's top-k is 1 when one
of its first k passages holds an answer: fid's DPR has-answer rule), averaged over k, the sweep
seeds (--sweep-seeds, default the first of --seeds) and the dev questions. The best (the first
listed on a tie) is trained with the other seeds and reported on the held-out questions: each
question's hits averaged over the seeds first, then over questions. Every row is compared with
each control per k: difference, paired bootstrap 95% interval and p-value over questions,
and Holm's adjusted p-value over every comparison printed (fid.evaluation.paired_comparisons;
* marks adjusted p < 0.05). The CPU seconds of each score-passages run are printed as
questions per CPU-second (scoring cost at larger sizes: benchmarks/reader/distillation_teachers.py).

Data sets: "demo" (`fid make-demo-data`: the reader lists hold the gold passage and 3 of the
same entity; held out: the test questions over the whole corpus) and "squad"
(samples/squad-open-tiny: BM25 top-`n` lists for all 200 questions; held out: every 4th
question, dev: every 8th of the rest, train: the others). Everything runs on one thread;
finished runs are reused from --out (their lists kept, their models deleted).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fid.evaluation.paired_comparisons import compare_to_references, with_holm  # noqa: E402
from fid.metrics.has_answer import AnswerMatcher  # noqa: E402

# The swept temperatures, five a row, a factor of ~3 apart: per-token scores (a passage's mean
# logit or attention, Atlas's per-token answer log-likelihood) around Atlas's 0.01-0.1; the
# summed answer log-likelihood is that times the answer's length (a few tokens), so 10x higher.
SHARP = (0.01, 0.03, 0.1, 0.3, 1.0)
SUMMED = (0.1, 0.3, 1.0, 3.0, 10.0)
# (mean_logit's dev score still rose at SHARP's 1.0 on squad-open-tiny: it sweeps on to 10)
# row -> (score mode, answer_log_likelihood, objective, train_n_passages, temperatures swept)
ROWS = {
    "mean_logit": ("mean_logit", "sum", "kl", None, SHARP + (3.0, 10.0)),  # rose up to 1
    "attention_mass": ("attention_mass", "sum", "kl", None, SHARP),
    "pdist": ("pdist", "sum", "kl", None, SUMMED),
    "pdist_mean": ("pdist", "mean", "kl", None, SHARP),
    "loop": ("loop", "sum", "kl", None, SUMMED),
    "loop_mean": ("loop", "mean", "kl", None, SHARP),
    "pdist+emdr2": ("pdist", "sum", "emdr2", None, (1.0,)),
    "uniform": ("uniform", "sum", "kl", None, (1.0,)),  # a flat target: T changes nothing
    "in_batch": ("uniform", "sum", "kl", 1, (1.0,)),  # one passage: T changes nothing
}
CONTROLS = ("uniform", "in_batch")
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


def _records(path: Path) -> list[dict]:
    """The question records of a JSON list (FiD lists) or a JSONL file (the demo's questions)."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


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


def _scores(out: Path, paths: dict, reader: Path, n: int, mode: str, convention: str) -> tuple:
    """Scores the train and dev lists once per (mode, convention); returns the two files'
    stem and the questions per CPU-second of the runs made now (NaN when reused)."""
    stem = f"scored-{mode}" + ("-mean" if convention == "mean" else "")
    config = dict(n_passages=n, batch_size=1, mode=mode, precision="fp32")
    if convention == "mean":
        config["answer_log_likelihood"] = "mean"
    seconds, questions = 0.0, 0
    for split in ("train", "dev"):
        if not (out / f"{stem}-{split}.json").is_file():
            seconds += _fid("score-passages", "--config", _yaml(out / f"{stem}.yaml", config),
                            "--model", reader, "--questions", paths[split],
                            "--output", out / f"{stem}-{split}.json")  # fmt: skip
            questions += len(json.loads(paths[split].read_text()))
    return stem, (questions / seconds if seconds else float("nan"))


def _retrieval_hits(out: Path, paths: dict, size: dict, row: str, stem: str, temperature: float,
                    seed: int, texts: dict) -> np.ndarray:  # fmt: skip
    """(Q_test + Q_dev, len(KS)) hits of one retriever: distilled from `stem`'s scores with
    `row`'s objective at `temperature`, then embedding, indexing and retrieving for the
    held-out questions followed by the dev questions (one file, one retrieve run)."""
    _, _, objective, train_n, _ = ROWS[row]
    tag = f"{row}-T{temperature:g}-{seed}"
    retrieved = out / f"retrieved-{tag}.json"
    if not retrieved.is_file():
        model, n, steps = out / f"retriever-{tag}", size["passages"], size["retriever_steps"]
        config = dict(
            seed=seed, objective=objective, n_passages=n, in_batch_negatives=True,
            retriever_temperature=0.05, question_max_tokens=24, passage_max_tokens=80,
            batch_size_per_device=size["batch"], max_steps=steps, lr=3e-3,
            warmup_steps=steps // 4, eval_k=[1], select_on="candidate_answer_recall@1",
            eval_every_steps=steps // 2, save_every_steps=steps // 2, log_every_steps=25,
            precision="fp32", tensorboard=False, train_n_passages=train_n)  # fmt: skip
        if objective == "kl":  # EMDR2 reads the likelihoods as they are (1.0)
            config["reader_temperature"] = temperature
        _fid("train-retriever", "--config", _yaml(out / f"retriever-{tag}.yaml", config),
             "--train", out / f"{stem}-train.json", "--dev", out / f"{stem}-dev.json",
             "--init-model", out / "init_retriever", "--output", model,
             "--state-dir", out / f"state-{tag}")  # fmt: skip
        _fid("embed-passages", "--config", out / "embed.yaml", "--model", model, "--passages",
             paths["passages"], "--output", out / f"shard-{tag}")  # fmt: skip
        _fid("build-index", "--shards", out / f"shard-{tag}", "--output", out / f"index-{tag}")
        _fid("retrieve", "--config", out / "retrieve.yaml", "--model", model, "--index",
             out / f"index-{tag}", "--passages", paths["passages"], "--questions",
             paths["evaluated"], "--output", retrieved)  # fmt: skip
        # the lists are kept; the model, index, shard and state (~10 MB a run) are not
        for made in [model, out / f"index-{tag}", out / f"state-{tag}"]:
            shutil.rmtree(made)
        for made in out.glob(f"shard-{tag}.*"):
            made.unlink()
    return _hits(retrieved, texts)


def run(name: str, out: Path, small: bool, seeds: list[int], sweep_seeds: list[int],
        rows: list[str], jobs: int) -> dict:  # fmt: skip
    """Per row: the temperature chosen on dev, the dev score of each swept temperature, the
    chosen one's (seeds, Q_test, len(KS)) held-out hits, and its scoring rate. Retrievers
    train `jobs` at a time (each on one thread)."""
    size = _sizes(small)
    out.mkdir(parents=True, exist_ok=True)
    paths = (_demo_data if name == "demo" else _squad_data)(out, size)
    heldout = _records(paths["heldout"])
    paths["evaluated"] = out / "data/evaluated.json"
    paths["evaluated"].write_text(json.dumps(heldout + _records(paths["dev"])))
    _yaml(out / "embed.yaml", dict(precision="fp32"))
    _yaml(out / "retrieve.yaml", dict(top_k=max(KS), precision="fp32"))
    n_test = len(heldout)
    reader = _models(out, paths, size)
    texts = _passage_texts(paths["passages"])
    stems, rates = {}, {}
    for row in rows:
        mode, convention = ROWS[row][:2]
        stems[row], rates[row] = _scores(out, paths, reader, size["passages"], mode, convention)
    # --small (the test) sweeps the middle two of a row's temperatures, the full run all five
    swept = {row: ROWS[row][4][1:3] if small and len(ROWS[row][4]) > 2 else ROWS[row][4]
             for row in rows}  # fmt: skip
    started = time.time()

    def train(job: tuple) -> np.ndarray:
        row, temperature, seed = job
        hits = _retrieval_hits(out, paths, size, row, stems[row], temperature, seed, texts)
        print(f"  {row} T {temperature:g} seed {seed}: {time.time() - started:.0f} s", flush=True)
        return hits

    def train_all(wanted: list[tuple]) -> dict:
        with ThreadPoolExecutor(jobs) as pool:  # threads wait on fid processes
            return dict(zip(wanted, pool.map(train, wanted), strict=True))

    # the sweep (every temperature with the sweep seeds), then the chosen one's other seeds
    done = train_all([(row, t, seed) for row in rows for t in swept[row] for seed in sweep_seeds])
    results = {}
    for row in rows:
        # temperature -> dev score (%): mean over ks, sweep seeds and dev questions
        dev = {t: 100 * float(np.mean([done[(row, t, s)][n_test:] for s in sweep_seeds]))
               for t in swept[row]}  # fmt: skip
        best = max(swept[row], key=lambda t: dev[t])  # the first listed on a tie
        results[row] = dict(temperature=best, dev=dev, rate=rates[row])
    done |= train_all([(row, results[row]["temperature"], seed) for row in rows
                       for seed in seeds if (row, results[row]["temperature"], seed) not in done])  # fmt: skip
    for row, result in results.items():
        result["hits"] = np.stack([done[(row, result["temperature"], s)][:n_test] for s in seeds])
        print(f"  {row}: dev {', '.join(f'T {t:g}: {v:.1f}' for t, v in result['dev'].items())}; "
              f"chose {result['temperature']:g}", flush=True)  # fmt: skip
    return results


def _models(out: Path, paths: dict, size: dict) -> Path:
    """The tokenizers' start models and the trained reader (made once, then reused)."""
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
            n_passages=size["passages"], passage_max_tokens=96, batch_size_per_device=8,
            max_steps=size["reader_steps"], lr=1e-3, warmup_steps=20,
            eval_every_steps=size["reader_steps"], save_every_steps=size["reader_steps"],
            log_every_steps=50, eval_batch_size=32, max_new_tokens=8, tensorboard=False,
            precision="fp32", activation_checkpointing=False, encoder_buckets=1)),
            "--train", paths["train"], "--dev", paths["dev"], "--init-model",
            out / "init_reader", "--output", reader, "--state-dir", out / "state-reader")  # fmt: skip
    return reader


def tables(results: dict) -> list[str]:
    """Markdown: each row's temperature, held-out top-k (mean over seeds and questions,
    percent) and the dev scores of its sweep, then every comparison against a control."""
    lines = ["| signal | T (dev) | " + " | ".join(f"top-{k}" for k in KS) + " | dev (T: score) |",
             "|---|---:|" + "---:|" * len(KS) + "---|"]  # fmt: skip
    for row, result in results.items():
        means = " | ".join(f"{100 * v:.1f}" for v in result["hits"].mean((0, 1)))
        swept = len(result["dev"]) > 1
        dev = ", ".join(f"{t:g}: {v:.1f}" for t, v in result["dev"].items())
        lines.append(f"| {row} | {result['temperature']:g}{'' if swept else ' (fixed)'} | "
                     f"{means} | {dev} |")  # fmt: skip
    # every row against each control, per k, each pair once; Holm over all of them
    scores = {row: result["hits"].mean(0) for row, result in results.items()}  # (Q, len(KS))
    found = with_holm(compare_to_references(scores, [c for c in CONTROLS if c in results]))
    if not found:
        return lines
    lines += ["", "| signal | vs | " + " | ".join(f"Δ top-{k} [95% CI] p (Holm p)" for k in KS)
              + " |", "|---|---|" + "---:|" * len(KS)]  # fmt: skip
    for start in range(0, len(found), len(KS)):
        cells = [f"{100 * c.difference:+.1f} [{100 * c.low:+.1f}, {100 * c.high:+.1f}] "
                 f"{c.p:.3f} ({c.holm:.3f}{' *' if c.holm < 0.05 else ''})"
                 for c in found[start : start + len(KS)]]  # fmt: skip
        lines.append(f"| {found[start].system} | {found[start].reference} | "
                     f"{' | '.join(cells)} |")  # fmt: skip
    survivors = [f"{c.system} vs {c.reference} top-{KS[c.column]} ({100 * c.difference:+.1f})"
                 for c in found if c.holm < 0.05]  # fmt: skip
    lines.append(f"\n{len(found)} comparisons; * Holm-adjusted p < 0.05: "
                 f"{', '.join(survivors) or 'none'}")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", choices=["demo", "squad"], default=["demo", "squad"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--sweep-seeds",
        type=int,
        nargs="+",
        help="seeds each swept temperature trains (default: the first of --seeds)",
    )
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--jobs", type=int, default=1, help="retrievers trained at once")
    parser.add_argument(
        "--small",
        action="store_true",
        help="the test's size (20 retriever steps)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "outputs/distillation_signals",
                        help="work folder (finished steps are reused)")  # fmt: skip
    args = parser.parse_args()
    sweep_seeds = args.sweep_seeds or args.seeds[:1]
    for name in args.data:
        started = time.time()
        print(f"{name}: temperatures chosen on dev (sweep seeds {sweep_seeds})", flush=True)
        results = run(name, args.out / name, args.small, args.seeds, sweep_seeds, args.rows,
                      args.jobs)  # fmt: skip
        q = next(iter(results.values()))["hits"].shape[1]
        print(f"\n{name}: {q} held-out questions, seeds {args.seeds}, "
              f"{time.time() - started:.0f} s wall")  # fmt: skip
        print("\n".join(tables(results)), flush=True)
        rates = {ROWS[r][0] + ("_mean" if ROWS[r][1] == "mean" else ""): v["rate"]
                 for r, v in results.items()}  # fmt: skip
        cells = ", ".join(f"{m} {r:.1f}" for m, r in rates.items() if r == r)
        print(f"scoring (questions per CPU-second, whole score-passages runs): {cells}")


if __name__ == "__main__":
    main()
