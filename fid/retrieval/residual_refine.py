"""Re-scoring a compressed index's shortlist in RAM from residual codes
(`build_index.refine_residual`): no vectors on disk, no disk read per search.

A compressed index (e.g. "IVF16384,PQ32") reconstructs each passage x as x1 = its list's
centroid plus its PQ-coded residual, and scores it q . x1. Here every passage also keeps the
codes of what x1 misses, r = x - x1, quantized by one product quantizer or several in turn
(stages "PQ128", "PQ128x10", "PQ64+PQ64": each stage codes what the stages before it missed).
A search takes the base index's `shortlist` candidates with their scores q . x1 and re-scores
them as q . x1 + q . r^, r^ the decoded stages: the inner product with a reconstruction that is
finer than either the base codes or a refinement of the raw vector of the same bytes, because
r is a much shorter vector than x (config/README.md, "Compact codes in RAM", measures it).

Why not faiss: its two-stage residual index (IndexIVFPQR, factory "IVF4096,PQ32+96") is built
only for the L2 metric ("IVFPQR not implemented for inner product search", faiss 1.15), and its
IndexRefine codes the raw vector. Only the inner-product metric is supported here: the base
index's score q . x1 is what makes the refined score one dot product per candidate (for l2 the
cross term needs x1 itself); faiss's IVFPQR serves l2.

The base index must score a passage by the inner product with its own decoded code (IVF with
PQ or SQ codes, optionally behind an orthonormal OPQ rotation: yes; fast-scan PQ, whose lookup
tables are rounded to 8 bits, or a PCA: no). `ResidualRefinement.check_base` tests exactly that
on the built index and refuses others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from fid.config import ConfigError
from fid.config.retrieval import parse_refine_stages
from fid.errors import DataError

logger = logging.getLogger(__name__)

CODES_FILE = "refine_codes.npy"
QUANTIZER_FILE = "refine_pq{stage}.faiss"

# Candidate rows decoded at a time: 32768 x 256 x 4 B = 33 MB of reconstructed residuals at
# d = 256; a group holds max(1, GATHER_ROWS // shortlist) queries.
GATHER_ROWS = 32768
# check_base: how far the base index's score may be from q . x1, relative to the scores' scale
# (float32 sums in another order: ~1e-6; fast-scan's 8-bit lookup tables: ~1e-2)
BASE_SCORE_TOLERANCE = 1e-4


def code_bytes(spec: str) -> int:
    """Bytes of residual codes a passage: the sum of the stages' ceil(M x bits / 8)."""
    return sum((m * bits + 7) // 8 for m, bits in parse_refine_stages(spec))


@dataclass
class ResidualRefinement:
    """The stages' quantizers and every passage's codes.

    Attributes:
        spec: the stages, as `build_index.refine_residual` names them.
        quantizers: one trained faiss.ProductQuantizer per stage.
        codes: (N, code_bytes) uint8, each row the stages' codes side by side; in RAM.
    """

    spec: str
    quantizers: list[faiss.ProductQuantizer]
    codes: np.ndarray

    @classmethod
    def train(cls, spec: str, base: faiss.Index, sample: np.ndarray) -> ResidualRefinement:
        """Trains each stage on what the base index and the stages before it miss of `sample`
        ((S, D) float32), in turn.

        Raises:
            ConfigError: for a base index that cannot encode and decode (faiss's sa_encode:
                e.g. HNSW), or a stage whose M does not divide D.
        """
        dim = sample.shape[1]
        quantizers = []
        residual = _base_residual(base, sample)
        for m, bits in parse_refine_stages(spec):
            if dim % m:
                raise ConfigError(
                    f"refine_residual = {spec!r}: PQ{m} needs a dimension divisible by {m}, the "
                    f"embeddings have d={dim}. Hint: use a divisor of {dim} (e.g. PQ{dim // 2})"
                )
            quantizer = faiss.ProductQuantizer(dim, m, bits)
            quantizer.train(residual)
            residual = residual - quantizer.decode(quantizer.compute_codes(residual))
            quantizers.append(quantizer)
        codes = np.empty((0, code_bytes(spec)), np.uint8)
        return cls(spec, quantizers, codes)

    def encode(self, base: faiss.Index, batch: np.ndarray) -> np.ndarray:
        """The stages' codes of (B, D) float32 `batch`: (B, code_bytes) uint8."""
        residual = _base_residual(base, batch)
        parts = []
        for quantizer in self.quantizers:
            stage = quantizer.compute_codes(residual)  # (B, code_size)
            residual = residual - quantizer.decode(stage)
            parts.append(stage)
        return np.concatenate(parts, axis=1)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """(n, code_bytes) uint8 -> (n, D) float32: the sum of the stages' reconstructions."""
        total, start = None, 0
        for quantizer in self.quantizers:
            stage = quantizer.decode(
                np.ascontiguousarray(codes[:, start : start + quantizer.code_size])
            )
            total = stage if total is None else total + stage
            start += quantizer.code_size
        return total

    def check_base(self, base: faiss.Index, factory: str, queries, rows, vectors) -> None:
        """Refuses a base index whose score of a passage is not q . x1 (x1 its decoded code):
        the refined score q . x1 + q . r^ would then not be the inner product with anything.

        Args:
            base: the filled base index.
            factory: its factory string, for the message.
            queries: (Q, D) float32 sample queries.
            rows: (R,) int64 sorted rows of passages to score, with `vectors` (R, D) float32
                their embeddings.

        Raises:
            ConfigError: when the base index's scores of those passages differ from q . x1 by
                more than BASE_SCORE_TOLERANCE of the scores' scale.
        """
        decoded = base.sa_decode(base.sa_encode(vectors))  # (R, D)
        expected = queries @ decoded.T  # (Q, R)
        selector = faiss.IDSelectorBatch(rows)
        params = faiss.SearchParameters(sel=selector)
        found, found_rows = _search_with(base, queries, len(rows), params)
        got = np.full(expected.shape, np.nan, np.float32)
        position = np.searchsorted(rows, np.where(found_rows >= 0, found_rows, rows[0]))
        for q in range(len(queries)):
            ok = found_rows[q] >= 0
            got[q, position[q, ok]] = found[q, ok]
        seen = ~np.isnan(got)
        scale = float(np.abs(expected).max()) or 1.0
        error = float(np.abs(got[seen] - expected[seen]).max(initial=0.0)) / scale
        if not seen.any() or error > BASE_SCORE_TOLERANCE:
            raise ConfigError(
                f"refine_residual with factory = {factory!r}: the index does not score a passage "
                f"by its inner product with its decoded code (off by {error:.1e} of the scores' "
                "scale), so the residual codes cannot refine it. Expected an IVF with PQ or SQ "
                "codes, optionally after OPQ (e.g. 'IVF16384,PQ32' or 'OPQ32_256,IVF16384,PQ32'); "
                "not fast-scan PQ ('x4fs') or PCA"
            )

    def rescore(
        self, queries: np.ndarray, scores: np.ndarray, candidates: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each query's candidates re-scored as base score + q . r^, the best k kept.

        Args:
            queries: (Q, D) float32.
            scores: (Q, S) the base index's scores q . x1 of `candidates`.
            candidates: (Q, S) int64 rows, -1 for none (S >= k).
            k: results kept per query.

        Returns:
            (scores, rows): (Q, k) float32, best first, -inf past the candidates found, and
            (Q, k) int64 rows, -1 there. Equal scores keep the base index's order.
        """
        n_queries, shortlist = candidates.shape
        k = min(k, shortlist)
        best = np.full((n_queries, k), -np.inf, dtype=np.float32)
        picked = np.full((n_queries, k), -1, dtype=np.int64)
        step = max(1, GATHER_ROWS // max(1, shortlist))
        for lo in range(0, n_queries, step):
            part = slice(lo, lo + step)
            found = candidates[part] >= 0  # (B, S)
            residuals = self.decode(self.codes[candidates[part][found]])  # (n_found, D)
            query_of = np.nonzero(found)[0]  # the query (within the group) of each found row
            refined = np.full(found.shape, -np.inf, dtype=np.float32)  # (B, S)
            refined[found] = scores[part][found] + np.einsum(
                "nd,nd->n", residuals, queries[part][query_of]
            )
            order = np.argsort(-refined, axis=1, kind="stable")[:, :k]  # (B, k)
            best[part] = np.take_along_axis(refined, order, axis=1)
            rows = np.take_along_axis(candidates[part], order, axis=1)
            rows[~np.isfinite(best[part])] = -1
            picked[part] = rows
        return best, picked

    def save(self, folder: Path) -> None:
        """Writes `refine_codes.npy` and one `refine_pq<i>.faiss` per stage into `folder`."""
        with open(folder / CODES_FILE, "wb") as handle:
            np.save(handle, self.codes, allow_pickle=False)
        for stage, quantizer in enumerate(self.quantizers):
            faiss.write_ProductQuantizer(
                quantizer, str(folder / QUANTIZER_FILE.format(stage=stage))
            )

    @classmethod
    def load(cls, folder: Path, spec: str, count: int, dim: int) -> ResidualRefinement:
        """Reads what `save` wrote, the codes into RAM (a search reads nothing from disk).

        Raises:
            DataError: for a missing or truncated file, or files that disagree with the index.
        """
        hint = "Hint: rebuild the index with `fid build-index`"
        stages = parse_refine_stages(spec)
        quantizers = []
        for stage, (m, bits) in enumerate(stages):
            path = folder / QUANTIZER_FILE.format(stage=stage)
            if not path.is_file():
                raise DataError(
                    f"{path}: missing; the index was built with refine_residual. {hint}"
                )
            try:
                quantizer = faiss.read_ProductQuantizer(str(path))
            except RuntimeError as error:
                raise DataError(f"{path}: cannot read: {error}. {hint}") from None
            if (quantizer.d, quantizer.M, quantizer.nbits) != (dim, m, bits):
                raise DataError(
                    f"{path}: a PQ{quantizer.M}x{quantizer.nbits} of d={quantizer.d}, but the "
                    f"index says stage {stage} of {spec!r} at d={dim}. {hint}"
                )
            quantizers.append(quantizer)
        path = folder / CODES_FILE
        if not path.is_file():
            raise DataError(f"{path}: missing; the index was built with refine_residual. {hint}")
        try:
            codes = np.load(path, allow_pickle=False)
        except ValueError as error:  # not a .npy, or shorter than its header says
            raise DataError(f"{path}: not a complete uint8 .npy array: {error}. {hint}") from None
        expected = (count, code_bytes(spec))
        if codes.dtype != np.uint8 or codes.shape != expected:
            raise DataError(
                f"{path}: holds {codes.dtype} {codes.shape}, but the index has {count} passages "
                f"with {spec!r} codes: expected uint8 {expected}. {hint}"
            )
        return cls(spec, quantizers, codes)


def _base_residual(base: faiss.Index, vectors: np.ndarray) -> np.ndarray:
    """x - x1: what the base index's code of each (n, D) float32 row misses."""
    try:
        return vectors - base.sa_decode(base.sa_encode(vectors))
    except RuntimeError as error:
        from fid.retrieval.index import faiss_message

        raise ConfigError(
            f"refine_residual needs a base index that encodes and decodes passages (an IVF with "
            f"PQ or SQ codes), but faiss says: {faiss_message(error)}"
        ) from None


def _search_with(base: faiss.Index, queries, k, params):
    """base.search with search parameters (a selector), through an OPQ/rotation wrapper."""
    ivf = faiss.try_extract_index_ivf(base)
    if ivf is not None:
        params = faiss.SearchParametersIVF(sel=params.sel, nprobe=ivf.nlist)
    return base.search(queries, k, params=params)


__all__ = ["CODES_FILE", "ResidualRefinement", "code_bytes"]
