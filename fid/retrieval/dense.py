"""Dense retrieval: questions encoded by the retriever, searched in the passage index.

`retrieve` (`rank_dense` for questions in memory) encodes questions (each rank its share),
searches the faiss index and returns FiD-format records whose ctxs carry DPR's `has_answer`.
Passages are embedded by fid.retrieval.embeddings. A batch of questions that runs out of memory
is redone in two halves (fid.runtime.oom_batch_halving).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fid.config import RetrieveConfig
from fid.data.passage_store import passages_for
from fid.data.passages import fetch_passages
from fid.data.questions import load_questions
from fid.models.loading import load_retriever
from fid.models.retriever import DualEncoder, RetrieverTokenizer
from fid.retrieval.index import PassageIndex
from fid.retrieval.index_sources import check_index_sources
from fid.retrieval.ranking import retrieval_records, write_compact_lists
from fid.runtime import distributed
from fid.runtime.fileio import atomic_write_json
from fid.runtime.oom_batch_halving import BatchSplitter
from fid.runtime.oom_injection import Injection
from fid.runtime.precision import autocast, resolve_precision
from fid.runtime.progress import progress

logger = logging.getLogger(__name__)


@torch.no_grad()
def encode_questions(
    model: DualEncoder,
    encode: RetrieverTokenizer,
    questions: Sequence[str],
    batch_size: int,
    device: torch.device,
    precision: str,
    ids: Sequence[str] | None = None,
    injection: Injection | None = None,
) -> np.ndarray:
    """(q, D) float32 question embeddings in input order (each rank encodes its share).

    A batch out of memory is redone in halves, the batch size lowered for the rest of the run
    (fid.runtime.oom_batch_halving); `ids`: the questions' ids, which its messages name (else
    their positions); `injection`: its simulated failures."""
    model.eval()
    shard = distributed.shard_indices(len(questions))
    out = np.empty((len(shard), model.dim), dtype=np.float32)
    bar = progress(desc="encode questions", unit="questions", total=len(shard), log=logger)

    def prepare(rows):
        return encode.questions([questions[shard[row]] for row in rows])

    def forward(batch):
        batch = batch.to(device)
        vectors = model.encode_questions(batch["input_ids"], batch["attention_mask"])
        return vectors.float().cpu().numpy()

    def describe(row: int) -> str:
        i = shard[row]
        return f"question {ids[i]!r}" if ids is not None else f"question {i + 1} (1-based)"

    splitter = BatchSplitter("retrieve", device, describe, batch_size, injection)
    rows = list(range(len(shard)))
    batches = [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]
    with autocast(device, precision), bar:
        for piece, vectors in splitter.run(batches, prepare, forward):
            out[piece] = vectors
            bar.update(len(vectors))
    gathered = distributed.gather_in_order(len(questions), list(out))
    return np.stack(gathered) if gathered else np.empty((0, model.dim), dtype=np.float32)


def rank_dense(
    model: DualEncoder,
    encode: RetrieverTokenizer,
    index: PassageIndex,
    passages_path,
    questions: Sequence[dict],
    cfg: RetrieveConfig,
    device: torch.device,
    injection: Injection | None = None,
) -> list[dict]:
    """Dense retrieval of the top `cfg.top_k` passages of each question, as FiD records."""
    scores, ranked_ids = search_dense(model, encode, index, questions, cfg, device, injection)
    needed = {passage_id for ids in ranked_ids for passage_id in ids}
    passages = fetch_passages(passages_path, needed)
    return retrieval_records(questions, ranked_ids, scores, passages, cfg.has_answer_mode)


def search_dense(model, encode, index, questions, cfg, device, injection=None):
    """(scores, ranked passage ids) of every question: the search of `rank_dense` alone."""
    # "auto": bf16 on a GPU, and on a CPU that computes it natively for a model wide enough
    width = model.question_encoder.config.hidden_size
    precision = resolve_precision(cfg.precision, device, width)
    logger.info("encoding questions in %s", precision)
    vectors = encode_questions(
        model, encode, [q["question"] for q in questions], cfg.batch_size, device, precision,
        ids=[str(q.get("id", "")) for q in questions], injection=injection,
    )  # fmt: skip
    set_search_knobs(index, cfg)
    return index.search_rows(vectors, cfg.top_k)


def set_search_knobs(index: PassageIndex, cfg: RetrieveConfig) -> None:
    """Applies the section's nprobe / ef_search / shortlist to the index (None keeps the
    index's own, from build_index).

    Raises:
        ConfigError: for a shortlist on an index built without `rerank`, or an index whose
            shortlist is smaller than top_k: before any question is encoded.
    """
    index.set_search_params(nprobe=cfg.nprobe, ef_search=cfg.ef_search, shortlist=cfg.shortlist)
    index.candidates_for(cfg.top_k)


def retrieve(
    cfg: RetrieveConfig,
    model_path: Path,
    index_path: Path,
    passages_path: Path,
    questions_path: Path,
    output: Path,
    device: torch.device,
) -> None:
    """`fid retrieve`: the top `cfg.top_k` passages of every question of a question file by
    the retriever and its index, written by rank 0 as FiD-format json or compact lists
    (`cfg.list_format`; `passages_path` may then be a passage store folder)."""
    questions = load_questions(questions_path)
    retriever, encode = load_retriever(
        model_path, cfg.question_max_tokens, None, device, override=cfg.override_model_settings
    )
    index = PassageIndex.load(index_path, expected_dim=retriever.dim)
    check_index_sources(index, index_path, model_path, passages_path)
    set_search_knobs(index, cfg)
    injection = Injection.from_env(distributed.world()[0])
    if cfg.list_format == "compact":
        scores, ranked = search_dense(retriever, encode, index, questions, cfg, device, injection)
        if distributed.is_main():
            store = passages_for(passages_path, (i for ids in ranked for i in ids))
            write_compact_lists(output, questions, ranked, scores, store, cfg.has_answer_mode)
    else:
        records = rank_dense(
            retriever, encode, index, passages_path, questions, cfg, device, injection
        )
        if distributed.is_main():
            atomic_write_json(output, records)
    logger.info("retrieved %d passages for %d questions into %s", cfg.top_k, len(questions), output)
