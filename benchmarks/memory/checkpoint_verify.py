"""What verifying a checkpoint costs next to writing it, per checksum.

A t5-base-sized reader (T5Config of t5-base: 12+12 layers, d_model 768, d_ff 3072, vocab
32128; random init, no download) with an AdamW state after one step is saved as `fid train`
saves it (`save_checkpoint`: safetensors weights, training_state.pt, fsync, manifest, rename)
into a temporary folder. Then, for each checksum, the manifest's files are checksummed as a
resume verifies them: from the page cache (the file was just written, or read by another rank)
and cold (the pages dropped with posix_fadvise, as after a restart on another node).

    python benchmarks/memory/checkpoint_verify.py
    python benchmarks/memory/checkpoint_verify.py --dir /scratch/tmp --repeats 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
from transformers import T5Config, T5ForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `benchmarks.*` from anywhere

from benchmarks.harness import record, timed, write_record  # noqa: E402
from fid.training import checkpoint, manifest  # noqa: E402
from fid.training.optim import build_optimizer, build_scheduler  # noqa: E402

T5_BASE = dict(
    vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_decoder_layers=12,
    num_heads=12, feed_forward_proj="relu", tie_word_embeddings=True,
)  # fmt: skip


def _training_objects():
    """The model, an AdamW with its moments filled by one step, and the schedule."""
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(**T5_BASE))
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.01)
    scheduler = build_scheduler(optimizer, "linear", 10, 1000, 0.0)
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter) * 1e-3
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer, scheduler


def _drop_cache(folder: Path) -> None:
    """Evicts a folder's (fsynced, so clean) pages from the page cache."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: TMPDIR)")
    parser.add_argument("--repeats", type=int, default=1, help="writes and verifications to time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, optimizer, scheduler = _training_objects()
    n_parameters = sum(p.numel() for p in model.parameters())
    print(f"model: {n_parameters / 1e6:.0f}M parameters (t5-base config), AdamW after one step")
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        state_dir = Path(root)
        progress = checkpoint.TrainingProgress(step=1)
        writes = []
        for _ in range(args.repeats):
            with timed() as clock:
                checkpoint.save_checkpoint(state_dir, model, optimizer, scheduler, None, progress,
                                           {}, keep_last=1)  # fmt: skip
            writes.append(clock.wall_s)
        folder = state_dir / "step-1"
        names = manifest.checkpoint_files(folder)
        size_mb = sum((folder / name).stat().st_size for name in names) / 1e6
        write_s = min(writes)
        with timed() as sealing:
            manifest.seal_checkpoint(folder)
        seal_s = sealing.wall_s
        found = {"size_mb": size_mb, "files": names, "write_s": write_s, "seal_s": seal_s}
        print(f"checkpoint: {size_mb:.0f} MB in {len(names)} files ({', '.join(names)})")
        print(f"write (save_checkpoint, {manifest.CHECKSUM} manifest and fsync included): "
              f"{write_s:.2f} s ({size_mb / write_s:.0f} MB/s); of which the manifest "
              f"{seal_s:.2f} s")  # fmt: skip
        print(f"\n{'checksum':<9} {'cache':<6} {'verify s':>9} {'MB/s':>7} {'x write':>8}")
        for name in manifest.CHECKSUMS:
            manifest.write_manifest(folder, manifest.describe_files(folder, names, name), name)
            for cache in ("warm", "cold"):
                times = []
                for _ in range(args.repeats):
                    if cache == "cold":
                        _drop_cache(folder)
                    with timed() as clock:
                        manifest.verify_checkpoint(folder)
                    times.append(clock.wall_s)
                verify_s = min(times)
                found[f"verify_s_{name}_{cache}"] = verify_s
                print(f"{name:<9} {cache:<6} {verify_s:>9.2f} {size_mb / verify_s:>7.0f} "
                      f"{verify_s / write_s:>8.2f}")  # fmt: skip
        _drop_cache(folder)
        with timed() as loading:
            checkpoint.load_checkpoint(folder, model, optimizer, scheduler, None)
        load_s = found["load_s_cold"] = loading.wall_s
        print(f"\nload (resume without verification, cold): {load_s:.2f} s "
              f"({size_mb / load_s:.0f} MB/s)")  # fmt: skip
    if args.json:
        write_record(args.json, record(__file__, found))


if __name__ == "__main__":
    main()
