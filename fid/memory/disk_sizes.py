"""What each stage will hold on disk: the formulas of the workflow's disk plan (rules/disk.smk)
and of `fid plan-disk`, with fid.runtime.disk_plan's rows and check.

Each figure is a formula of what the config says (download sizes, questions per split, top-k,
rounds, shards, keep_last_checkpoints, index factory) and of the model and corpus sizes; a file
that is already there counts as it is. The ratios below were measured on this project's runs
(docs/disk.md), where a formula alone cannot tell:

- GZIP_TEXT_RATIO: psgs_w100.tsv.gz (4,694,541,059 B) holds ~13.0 GB of TSV; other text
  compresses alike. A tar member's size is read from the archive once it is downloaded.
- PASSAGE_LINE_BYTES: bytes a DPR TSV line, where the file is not there yet (13.0 GB / 21M).
- BM25: bm25s's index is its CSC matrix (a 4-B score and a 4-B row for each distinct term of a
  passage), the passage ids (numpy unicode) and the vocabulary (its pointer and JSON entry,
  <= 28 B a term, Heaps' law over the tokens). How a text tokenizes (TextStats) is measured on
  the corpus's first 4 MiB when it is there (fid.retrieval.bm25.text_statistics), else taken
  from real Wikipedia passages (samples/dpr, DPR's rows) or, for the scale rehearsal, from its
  generator's text.
- Lists: compact lists hold ~37 B a retrieved passage (its id and score columns); FiD json
  holds the passage's text and title again plus ~155 B of keys and figures (428 B an entry on
  the tiny demo, whose lines are 277 B; 730 B at the rehearsal's 567). Scores files are lists
  with the reader's score column more: 1.1 x as FiD json (tiny demo), 1.52 x compact (58 B an
  entry at the rehearsal).
- Checkpoints: model.safetensors (fp32 weights) and training_state.pt (AdamW's two moments,
  the scheduler, the RNG states): 3.2 x the weights (tiny demo: 150,960 + 328,969 B).
"""

from __future__ import annotations

import math
import tarfile
from dataclasses import dataclass
from pathlib import Path

from fid.data.questions import load_questions
from fid.runtime.disk_plan import DiskRow, folder_bytes, format_size

GZIP_TEXT_RATIO = 2.8
PASSAGE_LINE_BYTES = 620
BM25_TERM_BYTES = 28
# bm25-stats' vocabulary: a term's df (int64) and its JSON string (a stem, quotes, ", ")
BM25_STATS_TERM_BYTES = 20
COMPACT_ENTRY_BYTES = 37
FID_JSON_ENTRY_OVERHEAD = 155
SCORES_OVER_LISTS = {"fid_json": 1.1, "compact": 1.52}
CHECKPOINT_OVER_WEIGHTS = 3.2
STORE_BYTES_PER_PASSAGE = 20  # the compact lists' passage store: row offsets and ids
# a fetched or built model's files beside its weights (config, tokenizer): t5-base's are
# 2.2 MB (tokenizer.json + spiece.model), bert-base-uncased's 0.7 MB; a built tiny tokenizer
# ~66 B a vocabulary entry
HUB_TOKENIZER_BYTES = 2_500_000
TOKENIZER_BYTES_PER_TOKEN = 70
TAR_READ_LIMIT = 256 << 20  # tar members are listed from archives up to this size


@dataclass(frozen=True)
class TextStats:
    """How a passage file tokenizes for BM25 (fid.retrieval.bm25.text_statistics): index
    entries (a passage's distinct terms) and tokens per byte of the file; its vocabulary
    follows Heaps' law, terms = heaps_k x tokens^heaps_beta."""

    entries_per_byte: float
    tokens_per_byte: float
    heaps_k: float
    heaps_beta: float


# samples/dpr/psgs_w100.subset.tsv: 751 of DPR's Wikipedia passages (Lucene stopwords, Porter)
WIKIPEDIA = TextStats(0.0913, 0.1178, 13.14, 0.606)
# fid make-scale-data's text, its whole 1/1000 file (12.5 MB): 164k terms at 1.7M tokens
SCALE_TEXT = TextStats(0.1325, 0.1356, 972.7, 0.358)


@dataclass(frozen=True)
class Corpus:
    """The passages a run reads: `passages` of `line_bytes` on average."""

    passages: int
    line_bytes: float
    id_chars: int

    @property
    def text_bytes(self) -> int:
        return int(self.passages * self.line_bytes)


def corpus(path: str | Path, text_bytes: int | None, passages: int | None = None) -> Corpus:
    """The corpus at `path` when it is there (lines counted from its first 4 MiB), else
    `passages` or `text_bytes` (an estimate) over DPR's line size."""
    path = Path(path)
    if path.is_file():
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(4 << 20)
        lines = head.splitlines()[1:]  # the header
        line_bytes = (len(head) / max(1, len(lines) + 1)) if lines else PASSAGE_LINE_BYTES
        count = passages or (len(lines) if len(head) == size else int(size / line_bytes))
        id_chars = max((len(line.split(b"\t", 1)[0]) for line in lines[:1000]), default=8)
        return Corpus(count, size / max(1, count), id_chars)
    if passages is None:
        passages = int((text_bytes or 0) / PASSAGE_LINE_BYTES)
    return Corpus(passages, PASSAGE_LINE_BYTES, len(str(passages)))


def demo_data_bytes(corpus_: Corpus, questions: int, n_passages: int) -> int:
    """`fid make-demo-data`'s world and gold folders: each the corpus and the questions
    (~130 B each), and FiD json reader files of n_passages (world) and 1 (gold) passages a
    question (~100 B of keys a passage, ~160 B a record; measured on the demo: 10.4 MB)."""
    copies = 2 * (corpus_.text_bytes + questions * 130)
    return int(copies + questions * ((n_passages + 1) * (corpus_.line_bytes + 100) + 320))


def extracted_bytes(archive: Path, archive_bytes: int | None, member: str | None) -> tuple:
    """(bytes, basis) of one extracted file: a single compressed file by GZIP_TEXT_RATIO; a
    tar member from the archive's header once it is downloaded (None before)."""
    if member is None:
        if archive_bytes is None:
            return None, "archive size not in the config"
        return int(
            archive_bytes * GZIP_TEXT_RATIO
        ), f"{GZIP_TEXT_RATIO} x {format_size(archive_bytes)}"
    if archive.is_file() and archive.stat().st_size <= TAR_READ_LIMIT:
        try:  # a broken archive is refused with its own error by rule extract
            with tarfile.open(archive) as tar:
                return tar.getmember(member).size, "its size in the archive"
        except KeyError:
            return None, "not in the archive"
        except (tarfile.TarError, OSError, EOFError):
            return None, "the archive cannot be read"
    return None, "a tar member: known once the archive is downloaded"


def bm25_bytes(corpus_: Corpus, text: TextStats = WIKIPEDIA) -> tuple[int, str]:
    """(bytes, basis) of the BM25 index: matrix, ids and vocabulary."""
    tokens = corpus_.text_bytes * text.tokens_per_byte
    terms = int(min(tokens, text.heaps_k * tokens**text.heaps_beta))
    entries = int(corpus_.text_bytes * text.entries_per_byte)
    planned = entries * 8 + corpus_.passages * 4 * corpus_.id_chars + terms * BM25_TERM_BYTES
    return planned, f"{entries:,} entries, ~{terms:,} terms"


def bm25_shards_bytes(corpus_: Corpus, text: TextStats, shards: int) -> tuple[int, str]:
    """(bytes, basis) of a sharded BM25 index's S shard indexes (bm25.shards = S > 1): together
    the whole matrix and ids, each with the whole vocabulary (a shard scores with the global
    term ids, fid.retrieval.bm25_shard)."""
    tokens = corpus_.text_bytes * text.tokens_per_byte
    terms = int(min(tokens, text.heaps_k * tokens**text.heaps_beta))
    entries = int(corpus_.text_bytes * text.entries_per_byte)
    planned = entries * 8 + corpus_.passages * 4 * corpus_.id_chars
    planned += shards * terms * BM25_TERM_BYTES
    return planned, f"{entries:,} entries, ~{terms:,} terms in each of {shards}"


def bm25_stats_bytes(corpus_: Corpus, text: TextStats) -> tuple[int, str]:
    """(bytes, basis) of bm25-stats' folder: the vocabulary and its document frequencies, and
    the tokenized corpus the shard builds read (4 B a token, 12 B a passage:
    fid.retrieval.bm25_stats)."""
    tokens = corpus_.text_bytes * text.tokens_per_byte
    terms = int(min(tokens, text.heaps_k * tokens**text.heaps_beta))
    planned = terms * BM25_STATS_TERM_BYTES + int(tokens) * 4 + corpus_.passages * 12
    return planned, f"~{terms:,} terms, {int(tokens):,} tokens"


def list_bytes(questions: int, top_k: int, corpus_: Corpus, compact: bool) -> int:
    """Bytes of one retrieved list file: questions x top_k entries."""
    entry = COMPACT_ENTRY_BYTES if compact else corpus_.line_bytes + FID_JSON_ENTRY_OVERHEAD
    return int(questions * top_k * entry)


def embeddings_bytes(corpus_: Corpus, dim: int) -> int:
    """float16 vectors (N, D) and the ids as numpy unicode (4 B a character)."""
    return corpus_.passages * (dim * 2 + 4 * corpus_.id_chars)


def index_bytes(
    corpus_: Corpus, dim: int, factory: str, rerank: bool, refine_bytes: int = 0
) -> tuple[int, str]:
    """(bytes, basis) of a faiss index of the corpus: faiss's own code size a vector (and the
    inverted lists' 8-B ids, the coarse centroids, PQ codebooks), the passage ids, the residual
    codes of refine_residual (`refine_bytes` a passage: fid.retrieval.residual_layout's
    code_bytes), and the float16 vectors kept for re-ranking."""
    import faiss

    built = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    index = faiss.downcast_index(built)  # a view: `built` owns the index
    ivf, hnsw, fixed = faiss.try_extract_index_ivf(index), getattr(index, "hnsw", None), 0
    if ivf is not None:  # codes and 8-B ids in the inverted lists; centroids, PQ codebooks
        per_vector = ivf.code_size + 8
        fixed = ivf.nlist * ivf.d * 4
        pq = getattr(faiss.downcast_index(ivf), "pq", None)
        fixed += pq.ksub * pq.d * 4 if pq is not None else 0
    elif hnsw is not None:  # its vectors' storage and the level-0 links: 2M neighbours of 4 B
        per_vector = index.storage.sa_code_size() + hnsw.nb_neighbors(0) * 4
    else:
        per_vector = index.sa_code_size()
    per_vector += 4 * corpus_.id_chars + (dim * 2 if rerank else 0)
    per_vector += refine_bytes
    basis = f"{corpus_.passages:,} x {per_vector} B ({factory}{', rerank' if rerank else ''})"
    return corpus_.passages * per_vector + fixed, basis


def model_files_bytes(folder: str | Path, weights: int | None, tokenizer: int) -> tuple:
    """(bytes, basis) of a model folder: as it is when it is there, else fp32 weights + the
    tokenizer's files."""
    if Path(folder).is_dir() and any(Path(folder).glob("*.safetensors")):
        return folder_bytes(folder), "its files"
    if weights is None:
        return None, "model shape unknown"
    return weights + tokenizer, f"{format_size(weights)} of fp32 weights + tokenizer"


def state_bytes(weights: int | None, tokenizer: int, checkpoints: int) -> tuple:
    """(bytes, basis) of a training state once done: its kept checkpoints and best_dev."""
    if weights is None:
        return None, "model shape unknown"
    checkpoint = int(weights * CHECKPOINT_OVER_WEIGHTS)
    return checkpoints * checkpoint + weights + tokenizer, (
        f"{checkpoints} checkpoint{'s' if checkpoints > 1 else ''} of {format_size(checkpoint)} + best_dev"
    )


def kept_checkpoints(max_steps: int, save_every_steps: int | None, keep_last: int) -> int:
    """Checkpoints a finished training keeps: one each save_every_steps (and the last step's),
    the last keep_last of them."""
    saves = math.ceil(max_steps / save_every_steps) if save_every_steps else 1
    return max(1, min(keep_last, saves))


def row(stage: str, folder: str, planned_and_basis: tuple) -> DiskRow:
    planned, basis = planned_and_basis
    return DiskRow(stage, folder, None if planned is None else int(planned), basis)


# ---------------------------------------------------------------- `fid plan-disk`: one command
def model_width(model: str) -> int:
    """The embedding width of a retriever folder or hub name: its projection (dual_encoder.json),
    else its encoder's hidden size."""
    import json

    from fid.memory.model_shapes import model_config
    from fid.models.retriever_spec import CONFIG_FILE

    spec = Path(model) / CONFIG_FILE
    if spec.is_file():
        projection = json.loads(spec.read_text()).get("projection_dim")
        if projection:
            return int(projection)
    return int(model_config(model, "encoder").hidden_size)  # T5's d_model too


def trained_weights(command: str, cfg, model: str) -> int:
    """fp32 bytes of what `command` (train-reader / train-retriever) trains from `model`."""
    from fid.memory.command_plans import command_plan_inputs
    from fid.memory.plan import model_bytes

    return model_bytes(command_plan_inputs(command, cfg, model, 1, "cpu"))


def _tokenizer_bytes(model: str) -> int:
    """A model folder's files beside its weights, else a hub model's usual."""
    folder = Path(model)
    if folder.is_dir():
        return sum(f.stat().st_size for f in folder.iterdir()
                   if f.is_file() and not f.name.endswith(".safetensors"))  # fmt: skip
    return HUB_TOKENIZER_BYTES


def command_rows(command: str, cfg, output: str, *, model: str | None = None,
                 passages: str | None = None, questions: list[str] | None = None,
                 lists: str | None = None, compact: bool = False,
                 refine_bytes: int = 0, text: TextStats = WIKIPEDIA) -> list[DiskRow]:  # fmt: skip
    """The rows of one command's outputs, written under `output` (train-*: the state folder
    then the exported model beside it)."""
    if command in ("train-reader", "train-retriever"):
        weights, tokenizer = trained_weights(command, cfg, model), _tokenizer_bytes(model)
        kept = kept_checkpoints(cfg.max_steps, cfg.save_every_steps, cfg.keep_last_checkpoints)
        return [
            row("training state", output, state_bytes(weights, tokenizer, kept)),
            row("exported model", output, model_files_bytes("-", weights, tokenizer)),
        ]
    if command == "score-passages":
        factor = SCORES_OVER_LISTS["compact" if compact else "fid_json"]
        size = Path(lists).stat().st_size
        return [
            DiskRow(
                "scores", output, int(size * factor), f"{factor} x {format_size(size)} of lists"
            )
        ]
    if command in ("retrieve", "retrieve-bm25"):
        count = sum(len(load_questions(path)) for path in questions or [])
        return [
            DiskRow(
                "lists",
                output,
                list_bytes(count, cfg.top_k, corpus(passages, None), compact),
                f"{count:,} questions x {cfg.top_k} passages",
            )  # fmt: skip
        ]
    corpus_ = corpus(passages, None)
    if command == "build-bm25":
        return [row("bm25 index", output, bm25_bytes(corpus_, text))]
    dim = model_width(model)
    if command == "embed-passages":
        return [DiskRow("embeddings", output, embeddings_bytes(corpus_, dim),
                        f"{corpus_.passages:,} passages x {dim} dims, float16")]  # fmt: skip
    return [row("index", output, index_bytes(corpus_, dim, cfg.factory, cfg.rerank, refine_bytes))]
