"""The embedded demo's data: the synthetic world written as a DPR passage file, question splits
(jsonl, with each question's gold passage) and FiD-format reader lists."""

from __future__ import annotations

import csv
import json
import logging
import pathlib
import random
from pathlib import Path
from typing import TextIO

from fid.config import DemoDataConfig
from fid.demo.world import World, build_world
from fid.runtime.fileio import atomic_directory, atomic_path, atomic_write_json

logger = logging.getLogger(__name__)


def make_demo_data(cfg: DemoDataConfig, output: Path) -> None:
    """Writes passages.tsv, {split}.jsonl (questions) and reader/{split}.json (FiD format)."""
    world = build_world(cfg.world_config())
    with atomic_directory(output) as tmp:
        write_world(world, tmp)
        for split in world.splits:
            records = reader_examples(world, split, cfg.n_passages, seed=cfg.seed)
            atomic_write_json(tmp / "reader" / f"{split}.json", records)
    sizes = {split: len(questions) for split, questions in world.splits.items()}
    logger.info("wrote %d passages and questions %s to %s", len(world.passages), sizes, output)


def reader_examples(world: World, split: str, n_passages: int, seed: int = 0) -> list[dict]:
    """Builds FiD-format records for a reader trained without a retriever.

    Each record's contexts are the gold passage, then the other passages of the same entity (hard
    distractors; a random subset if they do not all fit), then random passages of other entities,
    up to `n_passages` (or all passages if the corpus is smaller), shuffled. The "score" of a
    context is uniform in [0, 1) and independent of which context is gold, so a model cannot find
    the gold passage from the score order.

    Args:
        world: A world from `build_world`.
        split: "train", "dev" or "test".
        n_passages: Contexts per record, >= 1.
        seed: Seed of the distractor choice, the order and the scores.

    Returns:
        One record per question of the split, in split order:
        {"id", "question", "answers", "gold_passage_id",
         "ctxs": [{"id", "title", "text", "score"}, ...]}.

    Raises:
        ValueError: If `split` is not a split of the world or `n_passages` < 1.
    """
    if split not in world.splits:
        raise ValueError(
            f"split = {split!r} is not allowed: expected one of {sorted(world.splits)}"
        )
    if isinstance(n_passages, bool) or not isinstance(n_passages, int) or n_passages < 1:
        raise ValueError(f"n_passages = {n_passages!r} is not allowed: expected an int >= 1")
    index = {p.id: i for i, p in enumerate(world.passages)}
    by_title: dict[str, list[int]] = {}
    for i, p in enumerate(world.passages):
        by_title.setdefault(p.title, []).append(i)
    n_total = len(world.passages)
    k = min(n_passages, n_total)
    rng = random.Random(f"fid.synthetic:{seed}:reader:{split}")

    records: list[dict] = []
    for q in world.splits[split]:
        gold = index[q.gold_passage_id]
        same = [i for i in by_title[world.passages[gold].title] if i != gold]
        if len(same) > k - 1:
            same = rng.sample(same, k - 1)
        chosen = [gold, *same]
        taken = set(chosen)
        if 2 * k > n_total:
            # Much of the corpus is needed: draw from an explicit list, not by rejection.
            rest = [i for i in range(n_total) if i not in taken]
            chosen.extend(rng.sample(rest, k - len(chosen)))
        else:
            while len(chosen) < k:
                i = rng.randrange(n_total)
                if i not in taken:
                    taken.add(i)
                    chosen.append(i)
        rng.shuffle(chosen)
        ctxs = [
            {
                "id": world.passages[i].id,
                "title": world.passages[i].title,
                "text": world.passages[i].text,
                "score": rng.random(),
            }
            for i in chosen
        ]
        records.append(
            {
                "id": q.id,
                "question": q.question,
                "answers": list(q.answers),
                "gold_passage_id": q.gold_passage_id,
                "ctxs": ctxs,
            }
        )
    return records


def _text(path: pathlib.Path) -> TextIO:
    # newline="": the csv writer ends its rows itself, and json lines end in "\n"
    return open(path, "w", encoding="utf-8", newline="")


def write_world(world: World, out_dir: pathlib.Path) -> None:
    """Writes a world as a DPR-style passage file and one JSON-lines file per split.

    Writes `out_dir/passages.tsv` (header "id", "text", "title"; tab-separated, csv default
    quoting, "\\n" line ends) and `out_dir/{split}.jsonl` with one
    {"id", "question", "answers", "gold_passage_id"} object per line. Each file is written to a
    temporary name in `out_dir` and then moved into place (`fid.runtime.fileio.atomic_path`).

    Args:
        world: A world from `build_world`.
        out_dir: Output folder; created if missing.
    """
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    with atomic_path(out_dir / "passages.tsv") as tmp, _text(tmp) as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        for p in world.passages:
            writer.writerow([p.id, p.text, p.title])
    for split, questions in world.splits.items():
        with atomic_path(out_dir / f"{split}.jsonl") as tmp, _text(tmp) as f:
            for q in questions:
                record = {
                    "id": q.id,
                    "question": q.question,
                    "answers": list(q.answers),
                    "gold_passage_id": q.gold_passage_id,
                }
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
