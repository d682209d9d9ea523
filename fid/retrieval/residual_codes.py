"""Re-scoring a compressed index's shortlist in RAM from residual codes
(`build_index.refine_residual`): no vectors on disk, no disk read per search.

A compressed index (e.g. "IVF16384,PQ32") reconstructs each passage x as x1 = its list's
centroid plus its PQ-coded residual, and scores it q . x1. Here every passage also keeps the
codes of what x1 misses, r = x - x1. A search takes the base index's `shortlist` candidates
with their scores q . x1 and re-scores them as q . x1 + q . r^, r^ the decoded codes: the inner
product with a reconstruction finer than either the base codes or a refinement of the raw
vector of the same bytes, because r is a much shorter vector than x (docs/index.md,
"Residual codes in RAM", measures it).

This module holds the codes and that search (`ResidualRefinement`); the rest by job:
  * fid.retrieval.residual_layout: which product quantizers code which dimensions, and the
    bytes a passage (`code_bytes`, which the disk plan reads too);
  * fid.retrieval.residual_training: how r is coded (weighted, rotated, scaled for a byte
    budget), the training, each passage's codes, and the check of the base index;
  * fid.retrieval.residual_files: the files beside the index, written and read back.

Why not faiss: its two-stage residual index (IndexIVFPQR, factory "IVF4096,PQ32+96") is built
only for the L2 metric ("IVFPQR not implemented for inner product search", faiss 1.15), and its
IndexRefine codes the raw vector. Only the inner-product metric is supported here: the base
index's score q . x1 is what makes the refined score one dot product per candidate (for l2 the
cross term needs x1 itself); faiss's IVFPQR serves l2.
"""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np

from fid.retrieval.rerank import best_of_shortlists
from fid.retrieval.residual_layout import SCALE_BYTES, Layout


@dataclass
class ResidualRefinement:
    """How the residuals are coded, and every passage's codes.

    Attributes:
        spec: `build_index.refine_residual`: a byte budget or product-quantizer stages.
        rotation: (D, D) float32, the passage map T: a residual r is coded as r T (a budget:
            W^1/2 U, U the principal axes of r W^1/2 as columns; an index built before the
            weighting: U alone), or None (stages: r as it is).
        query_map: (D, D) float32, T^-T: q . r = (q T^-T) . (r T); None with `rotation`.
        layout: each stage's (lo, hi, M, bits): its product quantizer's dimensions of r T.
        quantizers: one trained faiss.ProductQuantizer per stage.
        scaled: whether each passage's codes end with SCALE_BYTES of float16 beta (a budget).
        codes: (N, code_size) uint8, the stages' codes side by side (then beta); in RAM.
    """

    spec: str | int
    rotation: np.ndarray | None
    query_map: np.ndarray | None
    layout: Layout
    quantizers: list[faiss.ProductQuantizer]
    scaled: bool
    codes: np.ndarray

    @property
    def code_size(self) -> int:
        """Bytes of codes a passage (the stages', then beta's if scaled)."""
        return self._stages_size + SCALE_BYTES * self.scaled

    @property
    def _stages_size(self) -> int:
        return sum(quantizer.code_size for quantizer in self.quantizers)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """(n, code_size) uint8 -> (n, D) float32: the coded residuals r T, in the coded space
        (`rotate` the queries to score them)."""
        dim = self.layout[0][1] if self.rotation is None else len(self.rotation)
        total = np.zeros((len(codes), dim), np.float32)
        start = 0
        for (lo, hi, _, _), quantizer in zip(self.layout, self.quantizers, strict=True):
            part = np.ascontiguousarray(codes[:, start : start + quantizer.code_size])
            total[:, lo:hi] += quantizer.decode(part)
            start += quantizer.code_size
        return total

    def rotate(self, queries: np.ndarray) -> np.ndarray:
        """(Q, D) queries q T^-T, whose inner products with `decode`'s r T are q . r."""
        return queries if self.query_map is None else queries @ self.query_map

    def scales(self, codes: np.ndarray) -> np.ndarray:
        """(n, code_size) uint8 -> (n,) float32 1 + beta (ones when not scaled)."""
        if not self.scaled:
            return np.ones(len(codes), np.float32)
        beta = np.ascontiguousarray(codes[:, self._stages_size :]).view(np.float16)[:, 0]
        return 1 + beta.astype(np.float32)

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
        rotated = self.rotate(queries)  # (Q, D)

        def refined(part: slice) -> np.ndarray:
            found = candidates[part] >= 0  # (B, S)
            codes = self.codes[candidates[part][found]]  # (n_found, code_size)
            query_of = np.nonzero(found)[0]  # the query (within the group) of each found row
            out = np.full(found.shape, -np.inf, dtype=np.float32)  # (B, S)
            residual_scores = np.einsum("nd,nd->n", self.decode(codes), rotated[part][query_of])
            out[found] = (scores[part][found] + residual_scores) * self.scales(codes)
            return out

        return best_of_shortlists(candidates, k, refined)


__all__ = ["ResidualRefinement"]
