"""Building residual codes (`build_index.refine_residual`, fid.retrieval.residual_codes): how
what a compressed index's codes miss of each passage, r = x - x1, is coded; the quantizers
trained on a sample; every passage's codes as it is added; and the check that the base index
can be refined at all. Used by the index's build (fid.retrieval.index_build) only.

How r is coded (`train_refinement`):
  * a byte budget (an int, e.g. 144) codes for the error that ranks, the error of q . x, not of
    x. Three steps:
    - weighted: a score's error is q . e (e = r - r^), and questions, like passages, put most of
      their length on a few directions: E[(q . e)^2] = e' W e with W the questions' second
      moment, estimated by the passages' (the training sample's, uncentred; the build has no
      questions). So the codes minimise the squared error of r W^1/2, and a query is scored as
      q W^-1/2 . (r W^1/2)^;
    - spread by variance: r W^1/2 is rotated onto its principal axes and the bits are spread
      over the axes by reverse water-filling (fid.retrieval.residual_layout's `allocate`). The
      passage map T = W^1/2 U (U the axes) and the query map T^-T = W^-1/2 U are saved;
    - scaled: the last SCALE_BYTES of each passage's codes are a float16 beta, the least-squares
      fit of x by (1 + beta) x^ (x^ = x1 + r^): it removes the error along x^ itself, the one
      every question near x sees in full (its top passages are those it points along), and the
      score is (q . x1 + q . r^)(1 + beta).
    At 1M passages, d = 384, 150 bytes on an IVF1024,PQ32 (docs/index.md): plain
    water-filling kept 0.966 of Flat's top-20 answers, weighted 0.976, scaled 0.971, both
    0.998: the two errors they remove are the two halves of what reorders close passages.
    A base without OPQ suits it (OPQ spreads the base's error evenly, leaving the weighting
    nothing to favour: 0.985 with it, 0.997 without, IVF16384,PQ32 + 150 B);
  * product-quantizer stages ("PQ128", "PQ128x10", "PQ64+PQ64"): each stage codes, over all
    dimensions, what the stages before it missed; no weighting, rotation or scale (faiss's
    stages, as they are).

The base index must score a passage by the inner product with its own decoded code (IVF with
PQ or SQ codes, optionally behind an orthonormal OPQ rotation: yes; fast-scan PQ, whose lookup
tables are rounded to 8 bits, or a PCA: no). `check_base` tests exactly that, on a copy of the
trained index holding a few sample passages, before the build adds any, and refuses others.
"""

from __future__ import annotations

import logging

import faiss
import numpy as np

from fid.config import ConfigError
from fid.config.retrieval import parse_refine_stages
from fid.retrieval.faiss_errors import faiss_message
from fid.retrieval.residual_codes import ResidualRefinement
from fid.retrieval.residual_layout import SCALE_BYTES, allocate, stage_bytes

logger = logging.getLogger(__name__)

# The passages' second moment W is inverted (W^-1/2) with its eigenvalues floored at this share
# of the largest: a direction no passage uses is scored as coded, not amplified without bound
WEIGHT_FLOOR = 1e-6

# check_base: passages the probe index holds, of which queries
CHECK_ROWS, CHECK_QUERIES = 256, 16
# check_base: how far the base index's score may be from q . x1, relative to the scores' scale
# (float32 sums in another order: ~1e-6; fast-scan's 8-bit lookup tables: ~1e-2)
BASE_SCORE_TOLERANCE = 1e-4


def train_refinement(spec: str | int, base: faiss.Index, sample: np.ndarray) -> ResidualRefinement:
    """Lays out and trains the stages on what the base index misses of `sample` ((S, D)
    float32), each stage on what the stages before it missed; no passage's codes yet.

    Raises:
        ConfigError: for a base index that cannot encode and decode (faiss's sa_encode:
            e.g. HNSW), a stage whose M does not divide D, or a budget too small for D.
    """
    dim = sample.shape[1]
    residual = _base_residual(base, sample)  # (S, D)
    if not residual.any():
        logger.warning(
            "refine_residual = %r: the index's codes are exact (nothing is left to refine); "
            "its codes only cost memory",
            spec,
        )
    rotation = query_map = None
    if isinstance(spec, int):
        weight, weight_inverse = _weights(sample)  # W^1/2, W^-1/2: (D, D) float64 each
        weighted = residual @ weight  # (S, D)
        # its principal axes (uncentred: inner products are preserved)
        variances, axes = np.linalg.eigh(weighted.T @ weighted / len(weighted))
        order = np.argsort(-variances)
        axes = axes[:, order]
        rotation = np.ascontiguousarray(weight @ axes, np.float32)
        query_map = np.ascontiguousarray(weight_inverse @ axes, np.float32)
        layout = allocate(
            variances[order], spec, max_bits=int(np.log2(len(residual))), spare=SCALE_BYTES
        )
        logger.info(
            "refine_residual = %d bytes: %s (%d bytes) and a scale (%d bytes)",
            spec,
            ", ".join(f"dims {lo}-{hi - 1}: PQ{m}x{bits}" for lo, hi, m, bits in layout),
            sum(stage_bytes(m, bits) for _, _, m, bits in layout),
            SCALE_BYTES,
        )
    else:
        layout = []
        for m, bits in parse_refine_stages(spec):
            if dim % m:
                raise ConfigError(
                    f"refine_residual = {spec!r}: PQ{m} needs a dimension divisible by {m}, "
                    f"the embeddings have d={dim}. Hint: use a divisor of {dim} (e.g. "
                    f"PQ{dim // 2}), or a byte budget (e.g. refine_residual: {dim // 2})"
                )
            layout.append((0, dim, m, bits))
    for _, _, m, bits in layout:
        if 2**bits > len(residual):
            raise ConfigError(
                f"refine_residual = {spec!r}: PQ{m}x{bits} trains {2**bits} centroids a "
                f"sub-quantizer, but there are {len(residual)} training vectors. Hint: raise "
                "train_sample, or use fewer bits"
            )
    quantizers = [faiss.ProductQuantizer(hi - lo, m, bits) for lo, hi, m, bits in layout]
    refinement = ResidualRefinement(
        spec,
        rotation,
        query_map,
        layout,
        quantizers,
        scaled=isinstance(spec, int),
        codes=np.empty((0, 0), np.uint8),
    )
    _encode(refinement, residual, train=True)  # (the sample's own codes are not kept)
    refinement.codes = np.empty((0, refinement.code_size), np.uint8)
    return refinement


def add_passages(
    refinement: ResidualRefinement, base: faiss.Index, batch: np.ndarray
) -> np.ndarray:
    """Adds (B, D) float32 `batch` to the base index and returns its residual codes,
    (B, code_size) uint8. The base encodes the batch once (for an IVF the list assignment
    is the build's largest cost): its codes are added as they are and decoded for x1."""
    base_codes = base.sa_encode(batch)
    _add_encoded(base, base_codes)
    decoded = base.sa_decode(base_codes)  # x1: (B, D)
    codes = _encode(refinement, batch - decoded)
    if not refinement.scaled:
        return codes
    # beta = argmin |x - (1 + beta) x^|^2, x^ = x1 + r^ (r^ back from the coded space)
    coded = decoded + refinement.decode(codes) @ refinement.query_map.T  # T^-1 = (T^-T)^T: (B, D)
    power = np.einsum("bd,bd->b", coded, coded)
    missed = np.einsum("bd,bd->b", batch - coded, coded)
    beta = np.divide(missed, power, out=np.zeros_like(power), where=power > 0)
    beta = np.clip(beta, -1.0, 1.0).astype(np.float16)  # (B,)
    return np.concatenate([codes, beta.view(np.uint8).reshape(len(batch), SCALE_BYTES)], 1)


def check_base(index: faiss.Index, factory: str, sample: np.ndarray) -> None:
    """Refuses a base index whose score of a passage is not q . x1 (x1 its decoded code):
    the refined score q . x1 + q . r^ would then not be the inner product with anything.
    Checked on a copy of the trained, empty `index` holding the first CHECK_ROWS of
    `sample` ((S, D) float32), every list probed, the first CHECK_QUERIES as queries.

    Raises:
        ConfigError: when the base index's scores of those passages differ from q . x1 by
            more than BASE_SCORE_TOLERANCE of the scores' scale.
    """
    vectors = sample[:CHECK_ROWS]  # (R, D)
    queries = vectors[:CHECK_QUERIES]  # (Q, D)
    probe = faiss.clone_index(index)
    probe.add(vectors)  # rows 0 .. R-1
    ivf = faiss.try_extract_index_ivf(probe)
    params = None if ivf is None else faiss.SearchParametersIVF(nprobe=ivf.nlist)
    found, rows = probe.search(queries, len(vectors), params=params)  # (Q, R) each
    expected = queries @ probe.sa_decode(probe.sa_encode(vectors)).T  # (Q, R)
    seen = rows >= 0
    got = np.take_along_axis(expected, np.where(seen, rows, 0), axis=1)
    scale = float(np.abs(expected).max()) or 1.0
    error = float(np.abs(found[seen] - got[seen]).max(initial=0.0)) / scale
    if not seen.any() or error > BASE_SCORE_TOLERANCE:
        raise ConfigError(
            f"refine_residual with factory = {factory!r}: the index does not score a passage "
            f"by its inner product with its decoded code (off by {error:.1e} of the scores' "
            "scale), so the residual codes cannot refine it. Expected an IVF with PQ or SQ "
            "codes, optionally after OPQ (e.g. 'IVF16384,PQ32' or 'OPQ32_256,IVF16384,PQ32'); "
            "not fast-scan PQ ('x4fs') or PCA"
        )


def _encode(
    refinement: ResidualRefinement, residual: np.ndarray, train: bool = False
) -> np.ndarray:
    """Codes (B, D) residuals stage by stage, each stage (trained first if `train`) coding
    its dimensions of what the stages before it missed."""
    if refinement.rotation is not None:
        residual = residual @ refinement.rotation
    residual = np.array(residual, np.float32)  # a copy, modified below
    parts = []
    for (lo, hi, _, _), quantizer in zip(refinement.layout, refinement.quantizers, strict=True):
        mine = np.ascontiguousarray(residual[:, lo:hi])
        if train:
            quantizer.train(mine)
        stage = quantizer.compute_codes(mine)  # (B, code_size)
        residual[:, lo:hi] -= quantizer.decode(stage)
        parts.append(stage)
    return np.concatenate(parts, axis=1)


def _weights(sample: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W^1/2 and W^-1/2, (D, D) float64 each, of the (S, D) passages' uncentred second moment W
    (eigenvalues floored at WEIGHT_FLOOR of the largest)."""
    sample = sample.astype(np.float64)
    values, vectors = np.linalg.eigh(sample.T @ sample / len(sample))
    values = np.maximum(values, max(values.max(), 1e-30) * WEIGHT_FLOOR)
    return (vectors * np.sqrt(values)) @ vectors.T, (vectors / np.sqrt(values)) @ vectors.T


def _base_residual(base: faiss.Index, vectors: np.ndarray) -> np.ndarray:
    """x - x1: what the base index's code of each (n, D) float32 row misses."""
    try:
        return vectors - base.sa_decode(base.sa_encode(vectors))
    except RuntimeError as error:
        raise ConfigError(
            f"refine_residual needs a base index that encodes and decodes passages (an IVF with "
            f"PQ or SQ codes), but faiss says: {faiss_message(error)}"
        ) from None


def _add_encoded(index: faiss.Index, codes: np.ndarray) -> None:
    """index.add for rows that index.sa_encode encoded: add_sa_codes on the innermost index
    (faiss 1.15's IndexPreTransform has none; its add transforms, adds to its index and
    copies ntotal: the same is done here after the transform sa_encode applied)."""
    wrappers, inner = [], faiss.downcast_index(index)
    while isinstance(inner, faiss.IndexPreTransform):
        wrappers.append(inner)
        inner = faiss.downcast_index(inner.index)
    inner.add_sa_codes(codes)
    for wrapper in wrappers:
        wrapper.ntotal = inner.ntotal


__all__ = ["add_passages", "check_base", "train_refinement"]
