"""Reader inference acceleration: speed at 100 passages, and exact match against the plain reader.

Two parts (issue 14 A):

`speed`: questions per second of greedy generation on one CPU thread, a t5-small-shaped T5
(d_model 512, 6 + 6 layers, 8 heads, d_ff 2048, vocab 32k; random weights: speed does not
depend on them) reading N real DPR passages (samples/, passage_max_tokens 250) per question.
EOS is made unreachable (its output-embedding row zeroed: its logit is 0, below the maximum of
32k random logits), so every setting decodes exactly --steps tokens. CPU time is split into
the encoder (FiDReader.encode, measured alone) and the rest (the decoder: its first step
projects the T = N x ~150 encoder states into every layer's keys and values, then each step
reads them).

`train`: the reader the quality part needs (a demo-world reader of 20 passages, trained by the
workflow in --workdir) and its fine-tuned variants with a plain fine-tuning as their control.

`quality`: exact match of a trained reader on a question file, plain against each option, with
the paired bootstrap 95% interval of the EM difference (10,000 resamples of the questions),
and CPU seconds per question. --variant NAME=MODEL adds fine-tuned readers (FiD-Light, FiDO)
evaluated the plain way against the same base.

    python benchmarks/reader/reader_acceleration.py speed --questions 2 --n 100 --steps 20
    python benchmarks/reader/reader_acceleration.py speed --questions 32 --n 100 --steps 20 \
        --batch-size 8 --device cuda --options ...                      # on a GPU: wall time
    python benchmarks/reader/reader_acceleration.py train --workdir /tmp/accel   # ~80 min on 2 cores
    python benchmarks/reader/reader_acceleration.py train --workdir /tmp/accel --continue-from 2400 \
        --variants plain fidlight16                                      # 2,400 steps more
    python benchmarks/reader/reader_acceleration.py quality --model M --questions dev.json --n 20 \
        [--passages STORE] [--variant fidlight=M2] [--plot pareto.png]
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks.harness` however this file is run
SAMPLES = ROOT / "samples"

from benchmarks.harness import (  # noqa: E402
    Timing,
    record,
    table_header,
    table_row,
    timed,
    write_record,
)

# name: EvalReaderConfig acceleration knobs
OPTIONS = {
    "plain": {},
    "plain, our loop": {},
    "prune k=1": {"keep_passages": 1},
    "prune k=2": {"keep_passages": 2},
    "prune k=5": {"keep_passages": 5},
    "prune k=10": {"keep_passages": 10},
    "tokens 5%": {"keep_tokens": 5.0},
    "tokens 10%": {"keep_tokens": 10.0},
    "tokens 25%": {"keep_tokens": 25.0},
    "tokens 10% ||v||": {"keep_tokens": 10.0, "keep_tokens_by_value_norm": True},
    "tokens 10% step 2": {"keep_tokens": 10.0, "keep_tokens_step": 2},
    "tokens 10% layer 0": {"keep_tokens": 10.0, "keep_tokens_layer": 0},
    "tokens 10% layer 1": {"keep_tokens": 10.0, "keep_tokens_layer": 1},
    "tokens 25% layer 0": {"keep_tokens": 25.0, "keep_tokens_layer": 0},
    "tokens 25% layer 1": {"keep_tokens": 25.0, "keep_tokens_layer": 1},
}


# name: FiDReader settings of a fine-tuned variant (fid.models.reader_variants)
VARIANTS = {
    "FiD-Light k=32": {"light_tokens": 32},
    "FiD-Light k=16": {"light_tokens": 16},
    "FiDO K=3": {"cross_attention_every": 3},
    "FiD-Light k=32 + FiDO K=3": {"light_tokens": 32, "cross_attention_every": 3},
}


def _seconds(timing: Timing, device) -> float:
    """CPU seconds of this process on a CPU; on a GPU wall seconds after the queued kernels
    finish (timed with a synchronize: CPU time there measures only the launching)."""
    return timing.wall_s if device.type == "cuda" else timing.cpu_s


# ------------------------------------------------------------------------------------ speed


def _speed_examples(n_questions: int, n_passages: int, seed: int = 0):
    from fid.data.examples import Example

    csv.field_size_limit(sys.maxsize)
    with open(SAMPLES / "dpr" / "psgs_w100.subset.tsv", newline="") as handle:
        passages = list(csv.DictReader(handle, delimiter="\t"))
    lines = (SAMPLES / "nq-open" / "NQ-open.dev.jsonl").read_text().splitlines()
    rng = random.Random(seed)
    examples = []
    for q in range(n_questions):
        record = json.loads(rng.choice(lines))
        ctxs = [
            {"id": p["id"], "title": p["title"], "text": p["text"]}
            for p in rng.sample(passages, n_passages)
        ]
        examples.append(Example(f"q{q}", record["question"], record["answer"], None, ctxs, {}))
    return examples, [p["title"] + " " + p["text"] for p in passages]


def speed(args) -> None:
    import torch
    from transformers import T5Config, T5ForConditionalGeneration
    from transformers.modeling_outputs import BaseModelOutput

    from fid.config import EvalReaderConfig
    from fid.data.reader_batches import ReaderCollator
    from fid.demo.tiny_models import train_tokenizer
    from fid.inference.accelerated_generation import accelerated_decode
    from fid.models.reader import FiDReader

    torch.set_num_threads(1)
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    examples, texts = _speed_examples(args.questions, args.n)
    tokenizer = train_tokenizer(texts, vocab_size=32000)
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=32128, d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_decoder_layers=6,
        num_heads=8, dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )  # fmt: skip
    t5 = T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        t5.lm_head.weight[config.eos_token_id] = 0  # EOS logit 0: never the argmax
    t5 = t5.to(device)
    reader = FiDReader(t5)
    reader.set_attention("auto", device)
    collator = ReaderCollator(tokenizer, args.n, 250)
    batches = [
        collator(examples[i : i + args.batch_size]).to(device)
        for i in range(0, len(examples), args.batch_size)
    ]
    tokens = sum(int(b.attention_mask.sum()) for b in batches) / len(examples)
    print(
        f"\n### Greedy generation: {len(examples)} questions x {args.n} DPR passages "
        f"({tokens:,.0f} encoder tokens per question), {args.steps} tokens each, batch "
        f"{args.batch_size}, t5-small shape, fp32, {_where(device)}\n"
    )
    with torch.no_grad():
        reader.generate(batches[0].input_ids, batches[0].attention_mask, 2)  # warm-up
        unit = "CPU s" if device.type != "cuda" else "s"
        columns = ["setting", "questions/s", "speed-up", f"decoder {unit}/question"]
        print(table_header([*columns, "decoder speed-up"], align="lrrrr"))
        base = None
        encode_s, rows = [], []
        for name in args.options:
            cfg = EvalReaderConfig(n_passages=args.n, **OPTIONS.get(name, {}))
            # a fine-tuned variant's shape (random weights: its speed is what is measured)
            variant = FiDReader(copy.deepcopy(t5), **VARIANTS[name]) if name in VARIANTS else None
            encoder, decoder = 0.0, 0.0
            for batch in batches:
                with timed(sync) as encoding_time:
                    encoding = (variant or reader).encode(batch.input_ids, batch.attention_mask)
                encoder += _seconds(encoding_time, device)
                with timed(sync) as decoding_time:
                    if name == "plain" or variant:  # transformers' generate, as eval-reader runs it
                        out = (variant or reader).t5.generate(
                            encoder_outputs=BaseModelOutput(last_hidden_state=encoding.hidden),
                            attention_mask=encoding.mask, max_new_tokens=args.steps,
                            num_beams=1, do_sample=False,
                        )  # fmt: skip
                    else:  # our loop ("plain, our loop": the same loop with nothing cut)
                        out = accelerated_decode(reader, encoding, args.n, args.steps, cfg)
                decoder += _seconds(decoding_time, device)
                assert out.shape[1] == args.steps + 1, out.shape
            encoder, decoder = encoder / len(examples), decoder / len(examples)
            encode_s.append(encoder)
            total = encoder + decoder
            base = base or (total, decoder)
            rows.append({"setting": name, "encoder_s": encoder, "decoder_s": decoder,
                         "questions_per_s": 1 / total})  # fmt: skip
            print(table_row([name, f"{1 / total:.3f}", f"{base[0] / total:.2f}x",
                             f"{decoder:.2f}", f"{base[1] / decoder:.2f}x"]))  # fmt: skip
    print(
        f"\nencoder: {np.mean(encode_s):.2f} {unit} per question (mean of the settings' "
        f"encodings, {min(encode_s):.2f}-{max(encode_s):.2f})"
    )
    if args.json:
        write_record(args.json, record(__file__, {"unit": unit, "speed": rows}))


def _where(device) -> str:
    if device.type == "cuda":
        import torch

        return f"{torch.cuda.get_device_name(device)} (wall time)"
    return "1 CPU thread (CPU time)"


# ---------------------------------------------------------------------------------- quality


def _evaluate(model: Path, examples, n: int, knobs: dict, batch_size: int, max_new: int):
    """(per-question EM 0/1, CPU seconds per question) of one model and option."""
    import torch

    from fid.config import EvalReaderConfig
    from fid.inference.batching import reader_and_collator
    from fid.inference.generation import generate_answers
    from fid.metrics.answers import exact_match

    cfg = EvalReaderConfig(
        n_passages=n, eval_batch_size=batch_size, max_new_tokens=max_new, precision="fp32",
        **knobs,
    )  # fmt: skip
    device = torch.device("cpu")
    reader, tokenizer, collator = reader_and_collator(cfg, model, device)
    with timed() as clock, torch.no_grad():
        predictions = generate_answers(
            reader, tokenizer, collator, examples, batch_size, max_new, 1, device, cfg
        )
    em = np.array([exact_match(p, e.answers) for p, e in zip(predictions, examples, strict=True)])
    return em.astype(float), clock.cpu_s / len(examples)


def quality(args) -> None:
    import torch

    from fid.data.examples import load_examples
    from fid.evaluation.bootstrap import paired_bootstrap_interval

    torch.set_num_threads(1)
    examples = load_examples(args.questions, passages=args.passages)
    if args.max_questions:
        examples = examples[: args.max_questions]
    runs = [(name, args.model, OPTIONS[name]) for name in args.options]
    for variant in args.variant:
        name, _, path = variant.rpartition("=")  # a name may hold "=" ("k=16")
        runs.append((name, Path(path), {}))
    print(
        f"\n### Exact match against the plain reader: {len(examples)} questions x {args.n} "
        f"passages ({args.questions}), greedy, 1 CPU thread\n"
    )
    columns = ["setting", "EM", "EM difference [95% CI]", "CPU s/question", "speed-up"]
    print(table_header(columns, align="lrrrr"))
    base_em, base_s = None, None
    points, rows = [], []
    for name, model, knobs in runs:
        em, seconds = _evaluate(model, examples, args.n, knobs, args.batch_size, args.max_new)
        if base_em is None:
            base_em, base_s = em, seconds
        low, high = paired_bootstrap_interval(em, base_em)
        diff = 100 * (em.mean() - base_em.mean())
        interval = f"{diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"
        print(table_row([name, f"{100 * em.mean():.1f}", interval, f"{seconds:.3f}",
                         f"{base_s / seconds:.2f}x"]))  # fmt: skip
        points.append((name, base_s / seconds, 100 * em.mean()))
        rows.append({"setting": name, "em": em.mean(), "em_difference": em.mean() - base_em.mean(),
                     "interval": [low, high], "cpu_s_per_question": seconds})  # fmt: skip
    if args.plot:
        _pareto_plot(points, args.plot)
    if args.json:
        write_record(args.json, record(__file__, {"quality": rows}))


def _pareto_plot(points, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, speedup, em in points:
        ax.scatter(speedup, em)
        ax.annotate(name, (speedup, em), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("speed-up over the plain reader (CPU time)")
    ax.set_ylabel("exact match (%)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"\nPareto plot: {path}")


# ------------------------------------------------------------------------------------ train

RUN = "accel"
# A demo reader that must find the answer among 20 passages: the demo world, the gold passage
# forced into BM25's top 20 (shuffled), the usual warm-up on the gold passage alone, then 20
# passages per question. Everything else is config/config.yaml's.
TRAIN_OVERRIDES = {
    "run": RUN,
    "rounds": 1,
    "compare": [],
    "data": {"curriculum": {"round0_lists": "gold_forced"}},
    "bm25": {"top_k": 20},
    "reader_lists": {"n_passages": 20},
    "reader": {"n_passages": 20, "max_steps": 1200, "eval_every_steps": 400},
    "eval_reader": {"n_passages": 20},
}
# Fine-tuned from that reader by `fid train-reader --init-model` (the demo's 2 decoder layers:
# FiDO's K = 2 keeps cross-attention in layer 0 only); "plain" fine-tunes it as long with
# nothing changed, the fair baseline of the variants' exact match.
FINE_TUNED = {
    "plain": {},  # the control: the same fine-tuning with nothing changed
    "fidlight16": {"light_tokens": 16},
    "fidlight32": {"light_tokens": 32},
    "fido2": {"cross_attention_every": 2},
    "fidlight32_fido2": {"light_tokens": 32, "cross_attention_every": 2},
    # a second training seed (data order, dropout) of two of them: how far one run is from another
    "plain_seed1": {"seed": 1},
    "fidlight16_seed1": {"light_tokens": 16, "seed": 1},
}


def _merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = _merge(base[key], value) if both else value
    return merged


def _variant_folder(name: str, args) -> str:
    """plain_2400: 2,400 steps from the base reader; plain_2400+2400: 2,400 more from that."""
    steps = str(args.fine_tune_steps)
    return f"{name}_{args.continue_from}+{steps}" if args.continue_from else f"{name}_{steps}"


def train(args) -> None:
    """Trains the base reader (Snakemake, in --workdir) and the fine-tuned variants."""
    import subprocess

    import yaml

    bin_dir = Path(sys.executable).parent
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    config = _merge(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()), TRAIN_OVERRIDES)
    (work / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    results = work / "results" / RUN / "iter0"
    targets = [f"results/{RUN}/iter0/reader/model"]
    targets += [f"results/{RUN}/iter0/reader_lists/{split}.json" for split in ("dev", "test")]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(
        [str(bin_dir / "snakemake"), "-s", str(ROOT / "Snakefile"), "--configfile",
         str(work / "config.yaml"), "--directory", str(work), "--cores", str(args.cores), *targets],
        check=True, env=env,
    )  # fmt: skip
    chosen = {name: FINE_TUNED[name] for name in args.variants}
    for name, settings in chosen.items():
        folder = work / "variants" / _variant_folder(name, args)
        start = results / "reader" / "model"
        if args.continue_from:  # a second fine-tuning of the variant's own earlier one
            start = work / "variants" / f"{name}_{args.continue_from}" / "model"
        if (folder / "model").exists():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        stage = _merge(config["reader"], {**settings, "max_steps": args.fine_tune_steps})
        (folder / "config.yaml").write_text(yaml.safe_dump(stage, sort_keys=False))
        subprocess.run(
            [str(bin_dir / "fid"), "--threads", str(args.cores), "train-reader", "--config",
             str(folder / "config.yaml"), "--train", str(results / "reader_lists" / "train.json"),
             "--dev", str(results / "reader_lists" / "dev.json"), "--init-model", str(start),
             "--output", str(folder / "model"),
             "--state-root", str(folder / "state")],
            check=True, env=env,
        )  # fmt: skip
    print(f"base reader: {results / 'reader' / 'model'}")
    print(f"questions: {results / 'reader_lists' / 'test.json'} (dev.json too)")
    for name in chosen:
        print(f"variant {name}: {work / 'variants' / _variant_folder(name, args) / 'model'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--questions", type=int, default=4)
    s.add_argument("--n", type=int, default=100)
    s.add_argument("--steps", type=int, default=20)
    s.add_argument("--batch-size", type=int, default=1)
    s.add_argument("--device", default="cpu", help="cpu, or cuda: wall time on the GPU")
    s.add_argument("--options", nargs="+", default=["plain", "plain, our loop", "prune k=5", "prune k=10",
                                                    "tokens 5%", "tokens 10%", "tokens 25%"])  # fmt: skip
    q = sub.add_parser("quality")
    q.add_argument("--model", type=Path, required=True)
    q.add_argument("--questions", type=Path, required=True)
    q.add_argument("--passages", type=Path)
    q.add_argument("--n", type=int, default=20)
    q.add_argument("--max-questions", type=int)
    q.add_argument("--batch-size", type=int, default=16)
    q.add_argument("--max-new", type=int, default=8)
    q.add_argument("--options", nargs="+", default=list(OPTIONS))
    q.add_argument("--variant", nargs="*", default=[], help="NAME=MODEL: a fine-tuned reader")
    q.add_argument("--plot", type=Path)
    for part in (s, q):
        part.add_argument("--json", type=Path, help="also write the run's record here")
    t = sub.add_parser("train")
    t.add_argument("--workdir", type=Path, default=Path("/tmp/fid_reader_acceleration"))
    t.add_argument("--cores", type=int, default=2)
    t.add_argument("--fine-tune-steps", type=int, default=2400)
    t.add_argument(
        "--continue-from",
        type=int,
        help="start each variant from its own fine-tuning of this many steps (a new schedule)",
    )
    t.add_argument("--variants", nargs="+", choices=list(FINE_TUNED), default=list(FINE_TUNED))
    args = parser.parse_args()
    {"speed": speed, "quality": quality, "train": train}[args.part](args)


if __name__ == "__main__":
    main()
