"""What each memory allocator setting costs a CPU job: CPU time, kernel time, page faults and
the resident peak against the tensors fid's memory plan predicts (issue 46.3).

    python benchmarks/memory/allocator.py                # every candidate, N = 10, 50, 100 (hours)
    python benchmarks/memory/allocator.py --passages 10  # N = 10 only (~15 min idle)
    python benchmarks/memory/allocator.py --candidates glibc,fixed-256k,tcmalloc --ops train

jemalloc, tcmalloc and mimalloc rows need Debian's libjemalloc2, libtcmalloc-minimal4 and
libmimalloc2.0 (apt-get install; not in `make setup`: fid does not use them); a row says "not installed" otherwise.

Each (candidate, operation, N) runs in a fresh process (an allocator is chosen per process:
LD_PRELOAD and glibc's tunables are read at its start, mallopt in it), one torch thread: the
operation once to warm up (AdamW's moments, the allocator's caches), then measured
(3 times at N = 10, once above): user and system CPU seconds and minor page faults per run
(getrusage), the resident peak of the measured runs above the process's resident size before
the model was built (VmHWM, reset through /proc/self/clear_refs), and the plan's peak for the
same inputs (fid.memory: the tensors plus the CPU allowance), which the resident peak should
stay within 10% of. Operations, on a t5-small-shaped reader with random weights (1 question,
N passages of 250 tokens): `train` an optimizer step with activation checkpointing (fid's
model, loss and AdamW), `generate` eval-reader's 20 answer tokens, `score` score-passages'
attention_mass (the demo's teacher); `embed` embed-passages on a batch of N passages of 250
tokens through an all-MiniLM-L6-v2-shaped encoder (the demo's pretrained retriever).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness import reset_peak, status_bytes  # noqa: E402
from benchmarks.memory import memory_plan  # noqa: E402 (the cases' models, inputs and runs)

MIB = 2**20
LIB = Path("/usr/lib/x86_64-linux-gnu")
MINILM = dict(hidden_size=384, intermediate_size=1536, num_attention_heads=12,
              num_hidden_layers=6, vocab_size=30522)  # fmt: skip


def _jemalloc(conf: str) -> tuple[dict, dict, bool]:
    """A jemalloc candidate: Debian's libjemalloc2 preloaded with MALLOC_CONF `conf`."""
    return {"LD_PRELOAD": str(LIB / "libjemalloc.so.2"), "MALLOC_CONF": conf}, {}, False


# name -> (environment at the process's start, mallopt settings, malloc_trim(0) after each run)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -2, -3, -4  # malloc.h's numbers
CANDIDATES: dict[str, tuple[dict, dict, bool]] = {
    "glibc": ({}, {}, False),  # glibc's own: the threshold rises with each mapped block freed
    "fixed-256k": ({}, {M_MMAP_THRESHOLD: 256 << 10}, False),  # fid until issue 46.3
    "fixed-256k-thp": (
        {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
        {M_MMAP_THRESHOLD: 256 << 10},
        False,
    ),  # fmt: skip
    "glibc-trim": ({}, {}, True),
    # a floor for the faults: nothing mapped on its own, nothing ever given back
    "glibc-keep": ({}, {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: 2**31 - 1, M_TOP_PAD: 64 << 20}, False),
    "fixed-32m-trim": (
        {},
        {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 1 << 20, M_TOP_PAD: 0},
        True,
    ),  # fmt: skip
    # jemalloc serves a request of oversize_threshold (8 MiB) or more from an arena that
    # purges at once (each such tensor faulted in afresh); 0 turns that off
    "jemalloc": ({"LD_PRELOAD": str(LIB / "libjemalloc.so.2")}, {}, False),
    "jemalloc-10s": _jemalloc("oversize_threshold:0"),
    # decays past a step's length (a t5-small step at N = 10: ~8 s): pages a step frees are
    # reused by the next before they are purged
    "jemalloc-30s": _jemalloc("oversize_threshold:0,dirty_decay_ms:30000,muzzy_decay_ms:0"),
    "jemalloc-60s": _jemalloc("oversize_threshold:0,dirty_decay_ms:60000,muzzy_decay_ms:0"),
    # freed pages handed back lazily (MADV_FREE at once: reclaimed only under memory pressure,
    # a cgroup's limit included; reused without a fault until then), never purged outright
    "jemalloc-lazy": _jemalloc("oversize_threshold:0,dirty_decay_ms:0,muzzy_decay_ms:-1"),
    "jemalloc-1s": _jemalloc("oversize_threshold:0,dirty_decay_ms:1000,muzzy_decay_ms:0"),
    "jemalloc-keep": _jemalloc("oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1"),
    # Microsoft's mimalloc (Debian's libmimalloc2.0, 2.0.9): frees its pages back after
    # reset_delay ms (100 by default)
    "mimalloc": ({"LD_PRELOAD": str(LIB / "libmimalloc.so.2")}, {}, False),
    "mimalloc-10s": (
        {"LD_PRELOAD": str(LIB / "libmimalloc.so.2"), "MIMALLOC_RESET_DELAY": "10000"},
        {},
        False,
    ),  # fmt: skip
    "tcmalloc": ({"LD_PRELOAD": str(LIB / "libtcmalloc_minimal.so.4")}, {}, False),
    # gperftools returns freed pages by count (load-independent), the more the higher the rate
    "tcmalloc-10": (
        {"LD_PRELOAD": str(LIB / "libtcmalloc_minimal.so.4"), "TCMALLOC_RELEASE_RATE": "10"},
        {},
        False,
    ),  # fmt: skip
    "tcmalloc-decommit": (
        {
            "LD_PRELOAD": str(LIB / "libtcmalloc_minimal.so.4"),
            "TCMALLOC_AGGRESSIVE_DECOMMIT": "true",
        },
        {},
        False,
    ),  # fmt: skip
}
OPS = ("train", "generate", "score", "embed")


def _case(op: str, passages: int) -> dict:
    """memory_plan.py's case for the operation at N passages."""
    if op == "train":
        return dict(command="train-reader", model="t5-small", questions=1, passages=passages,
                    tokens=250, checkpointing=True)  # fmt: skip
    if op in ("generate", "score"):
        return dict(command="eval-reader" if op == "generate" else "score-passages",
                    model="t5-small", questions=1, passages=passages, tokens=250,
                    checkpointing=False, mode="generate" if op == "generate" else "attention_mass")  # fmt: skip
    return dict(command="embed-passages", model="minilm", questions=passages, passages=1,
                tokens=250, checkpointing=False, mode="embed")  # fmt: skip


def _embed_inputs(case: dict):
    from transformers import BertConfig

    from fid.memory.inference_plan import InferenceInputs

    return InferenceInputs("embed-passages", BertConfig(**MINILM), case["questions"], 1,
                           case["tokens"], mode="embed", device="cpu")  # fmt: skip


def _embed_batch(inputs):
    """One embed-passages batch through the DualEncoder: (P, L) ids -> (P, D)."""
    import torch
    from transformers import AutoModel

    from fid.models.retriever import DualEncoder
    from fid.models.retriever_spec import DualEncoderSpec

    model = DualEncoder(AutoModel.from_config(inputs.config), None, DualEncoderSpec()).eval()
    mask = memory_plan._padded_mask(inputs.batch, inputs.passage_tokens, "cpu")
    ids = torch.randint(2, inputs.config.vocab_size, mask.shape) * mask

    @torch.no_grad()
    def batch():
        model.encode_passages(ids, mask)

    return batch


def measure(case: dict, candidate: str) -> dict:
    """Runs one case in this process under `candidate` (its environment already set)."""
    _, options, trim = CANDIDATES[candidate]
    libc = ctypes.CDLL("libc.so.6")
    for parameter, value in options.items():
        if not libc.mallopt(parameter, value):
            raise RuntimeError(f"mallopt({parameter}, {value}) refused")
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    device = torch.device("cpu")
    if "mode" in case:
        from fid.memory.inference_plan import plan_inference

        inputs = (
            _embed_inputs(case)
            if case["mode"] == "embed"
            else memory_plan._plan_inputs(case, "cpu")
        )

        plan = plan_inference(inputs)
    else:
        from fid.memory.plan import plan_step

        inputs = memory_plan._plan_inputs(case, "cpu")
        plan = plan_step(inputs)
    baseline = status_bytes("VmRSS")
    if case.get("mode") == "embed":
        run = _embed_batch(inputs)
    elif "mode" in case:
        run = memory_plan._inference_batch(inputs, device)
    else:
        run = memory_plan._training_step(case, inputs, device)

    def once():
        run()
        if trim:  # a phase's end: fid would trim here (after a step, a batch)
            libc.malloc_trim(0)

    once()  # warm-up
    repeats = 3 if case["passages"] * case["questions"] <= 10 else 1
    reset_peak("cpu")
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(repeats):
        once()
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - start
    return dict(case, candidate=candidate, repeats=repeats, wall=wall / repeats,
                user=(after.ru_utime - before.ru_utime) / repeats,
                system=(after.ru_stime - before.ru_stime) / repeats,
                faults=(after.ru_minflt - before.ru_minflt) / repeats,
                peak=status_bytes("VmHWM") - baseline, plan=plan.peak)  # fmt: skip


def _available(candidate: str) -> bool:
    preload = CANDIDATES[candidate][0].get("LD_PRELOAD")
    return preload is None or Path(preload).exists()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--passages", default="10,50,100")
    parser.add_argument("--json", type=Path, help="append the rows here (JSON lines)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in a fresh process
    parser.add_argument("--candidate", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(measure(json.loads(args.case), args.candidate)))
        return
    print("one torch thread; CPU s and faults per run; peak and plan in MiB")
    print("| op | N | candidate | user s | system s | system/user | minor faults | "
          "peak | plan | peak/plan |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for op in args.ops.split(","):
        for passages in (int(n) for n in args.passages.split(",")):
            for candidate in args.candidates.split(","):
                if not _available(candidate):
                    print(f"| {op} | {passages} | {candidate} | (not installed) |||||||")
                    continue
                env = dict(os.environ, **CANDIDATES[candidate][0])
                for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
                    env.pop(name, None)  # the candidate's settings alone
                command = [sys.executable, __file__, "--candidate", candidate,
                           "--case", json.dumps(_case(op, passages))]  # fmt: skip
                result = subprocess.run(command, capture_output=True, text=True, env=env)
                if result.returncode != 0:
                    sys.exit(f"{op} N={passages} {candidate} failed:\n{result.stderr[-3000:]}")
                row = json.loads(result.stdout.strip().splitlines()[-1])
                print(
                    f"| {op} | {passages} | {candidate} | {row['user']:.2f} | "
                    f"{row['system']:.2f} | {100 * row['system'] / row['user']:.1f}% | "
                    f"{row['faults']:.0f} | {row['peak'] / MIB:.0f} | {row['plan'] / MIB:.0f} | "
                    f"{row['peak'] / row['plan']:.2f} |",
                    flush=True,
                )
                if args.json:
                    with args.json.open("a") as out:
                        out.write(json.dumps(dict(row, op=op)) + "\n")


if __name__ == "__main__":
    main()
