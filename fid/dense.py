"""Dense retrieval: passage embeddings by shard, question encoding, index search.

`embed_passages` reads one contiguous shard of the passage file (so shards run as separate jobs),
sorts passages by token length within chunks, so each batch is padded only to its own longest,
and writes float16 embeddings with the passage ids. `retrieve` encodes questions, searches the
faiss index and writes FiD-format records with `has_answer`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from itertools import islice

import numpy as np
import torch

from fid import distributed
from fid.config import EmbedPassagesConfig, RetrieveConfig
from fid.index import PassageIndex
from fid.logs import progress
from fid.passages import Passage, fetch_passages
from fid.ranking import retrieval_records
from fid.retriever import DualEncoder, RetrieverTokenizer
from fid.training.loop import autocast

logger = logging.getLogger(__name__)


def _chunks(items: Iterator, size: int) -> Iterator[list]:
    while chunk := list(islice(items, size)):
        yield chunk


@torch.no_grad()
def embed_passages(
    model: DualEncoder,
    encode: RetrieverTokenizer,
    passages: Iterator[Passage],
    cfg: EmbedPassagesConfig,
    device: torch.device,
    total: int | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Embeds passages in input order.

    Args:
        model: the retriever (its passage encoder is used).
        encode: tokenization of `title [SEP] text` pairs.
        passages: the passages of one shard.
        cfg: batch size, chunking for length sorting, precision.
        device: where the model is.
        total: passage count for the progress log (its percentage and ETA), when known.

    Returns:
        (n, D) float16 embeddings and the n passage ids.
    """
    model.eval()
    parts, ids = [], []
    bar = progress(desc="embed", unit="passages", total=total, log=logger)
    amp = autocast(device, cfg.precision)
    for chunk in _chunks(iter(passages), cfg.sort_chunk):
        titles = [p.title for p in chunk]
        texts = [p.text for p in chunk]
        order = list(range(len(chunk)))
        if cfg.sort_by_length:
            lengths = encode.passage_lengths(titles, texts)
            order.sort(key=lambda i: lengths[i])
        embedded = np.empty((len(chunk), model.dim), dtype=np.float16)
        for start in range(0, len(order), cfg.batch_size):
            rows = order[start : start + cfg.batch_size]
            batch = encode.passages([titles[i] for i in rows], [texts[i] for i in rows])
            if cfg.pad_to_max_length:  # the fixed-padding baseline of the benchmark
                batch = encode.tokenizer(
                    [titles[i] for i in rows],
                    [texts[i] for i in rows],
                    truncation="only_second",
                    max_length=cfg.passage_max_tokens,
                    padding="max_length",
                    return_tensors="pt",
                )
            with amp:
                vectors = model.encode_passages(
                    batch["input_ids"].to(device), batch["attention_mask"].to(device)
                )
            embedded[rows] = vectors.float().cpu().numpy()
            bar.update(len(rows))
        parts.append(embedded)
        ids.extend(p.id for p in chunk)
    bar.close()
    if not parts:
        return np.empty((0, model.dim), dtype=np.float16), []
    return np.concatenate(parts), ids


@torch.no_grad()
def encode_questions(
    model: DualEncoder,
    encode: RetrieverTokenizer,
    questions: Sequence[str],
    batch_size: int,
    device: torch.device,
    precision: str,
) -> np.ndarray:
    """(q, D) float32 question embeddings in input order (each rank encodes its share)."""
    model.eval()
    mine = [questions[i] for i in distributed.shard_indices(len(questions))]
    out = np.empty((len(mine), model.dim), dtype=np.float32)
    bar = progress(desc="encode questions", unit="questions", total=len(mine), log=logger)
    with autocast(device, precision), bar:
        for start in range(0, len(mine), batch_size):
            batch = encode.questions(list(mine[start : start + batch_size])).to(device)
            vectors = model.encode_questions(batch["input_ids"], batch["attention_mask"])
            out[start : start + len(vectors)] = vectors.float().cpu().numpy()
            bar.update(len(vectors))
    rows = distributed.gather_in_order(len(questions), list(out))
    return np.stack(rows) if rows else np.empty((0, model.dim), dtype=np.float32)


def retrieve(
    model: DualEncoder,
    encode: RetrieverTokenizer,
    index: PassageIndex,
    passages_path,
    questions: Sequence[dict],
    cfg: RetrieveConfig,
    device: torch.device,
) -> list[dict]:
    """Dense retrieval of the top `cfg.top_k` passages of each question, as FiD records."""
    vectors = encode_questions(
        model, encode, [q["question"] for q in questions], cfg.batch_size, device, cfg.precision
    )
    if cfg.nprobe is not None or cfg.ef_search is not None:
        index.set_search_params(nprobe=cfg.nprobe, ef_search=cfg.ef_search)
    scores, ranked_ids = index.search(vectors, cfg.top_k)
    needed = {passage_id for ids in ranked_ids for passage_id in ids}
    passages = fetch_passages(passages_path, needed)
    return retrieval_records(questions, ranked_ids, scores, passages, cfg.has_answer_mode)
