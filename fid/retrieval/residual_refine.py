"""Re-scoring a compressed index's shortlist in RAM from residual codes
(`build_index.refine_residual`): no vectors on disk, no disk read per search.

A compressed index (e.g. "IVF16384,PQ32") reconstructs each passage x as x1 = its list's
centroid plus its PQ-coded residual, and scores it q . x1. Here every passage also keeps the
codes of what x1 misses, r = x - x1. A search takes the base index's `shortlist` candidates
with their scores q . x1 and re-scores them as q . x1 + q . r^, r^ the decoded codes: the inner
product with a reconstruction finer than either the base codes or a refinement of the raw
vector of the same bytes, because r is a much shorter vector than x (config/README.md,
"Residual codes in RAM", measures it).

How r is coded (`refine_residual`):
  * a byte budget (an int, e.g. 144) codes for the error that ranks, the error of q . x, not of
    x. Three steps:
    - weighted: a score's error is q . e (e = r - r^), and questions, like passages, put most of
      their length on a few directions: E[(q . e)^2] = e' W e with W the questions' second
      moment, estimated by the passages' (the training sample's, uncentred; the build has no
      questions). So the codes minimise the squared error of r W^1/2, and a query is scored as
      q W^-1/2 . (r W^1/2)^;
    - spread by variance: r W^1/2 is rotated onto its principal axes and the bits are spread
      over the axes by reverse water-filling: an axis of variance v gets ~0.5 log2(v / theta)
      bits, theta set so that the codes fit the budget, each group of GROUP axes rounded to the
      nearest rate a product quantizer offers (RATES: 1 dim a sub-quantizer at 6-8 bits, 2 at
      6-10, 4, 8 or 16 at 8). The passage map T = W^1/2 U (U the axes) and the query map
      T^-T = W^-1/2 U are saved;
    - scaled: the last SCALE_BYTES of each passage's codes are a float16 beta, the least-squares
      fit of x by (1 + beta) x^ (x^ = x1 + r^): it removes the error along x^ itself, the one
      every question near x sees in full (its top passages are those it points along), and the
      score is (q . x1 + q . r^)(1 + beta).
    At 1M passages, d = 384, 150 bytes on an IVF1024,PQ32 (config/README.md): plain
    water-filling kept 0.966 of Flat's top-20 answers, weighted 0.976, scaled 0.971, both
    0.998: the two errors they remove are the two halves of what reorders close passages.
    A base without OPQ suits it (OPQ spreads the base's error evenly, leaving the weighting
    nothing to favour: 0.985 with it, 0.997 without, IVF16384,PQ32 + 150 B);
  * product-quantizer stages ("PQ128", "PQ128x10", "PQ64+PQ64"): each stage codes, over all
    dimensions, what the stages before it missed; no weighting, rotation or scale (faiss's
    stages, as they are).

Why not faiss: its two-stage residual index (IndexIVFPQR, factory "IVF4096,PQ32+96") is built
only for the L2 metric ("IVFPQR not implemented for inner product search", faiss 1.15), and its
IndexRefine codes the raw vector. Only the inner-product metric is supported here: the base
index's score q . x1 is what makes the refined score one dot product per candidate (for l2 the
cross term needs x1 itself); faiss's IVFPQR serves l2.

The base index must score a passage by the inner product with its own decoded code (IVF with
PQ or SQ codes, optionally behind an orthonormal OPQ rotation: yes; fast-scan PQ, whose lookup
tables are rounded to 8 bits, or a PCA: no). `ResidualRefinement.check_base` tests exactly that,
on a copy of the trained index holding a few sample passages, before the build adds any, and
refuses others.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from fid.config import ConfigError
from fid.config.retrieval import parse_refine_stages
from fid.errors import DataError
from fid.retrieval.rerank import best_of_shortlists

logger = logging.getLogger(__name__)

CODES_FILE = "refine_codes.npy"
QUANTIZER_FILE = "refine_pq{stage}.faiss"
LAYOUT_FILE = "refine_layout.json"
ROTATION_FILE = "refine_rotation.npy"  # a budget's passage map T
QUERY_MAP_FILE = "refine_query_map.npy"  # its query map T^-T

# A budget's scale beta: the last bytes of each passage's codes, one float16
SCALE_BYTES = 2
# The passages' second moment W is inverted (W^-1/2) with its eigenvalues floored at this share
# of the largest: a direction no passage uses is scored as coded, not amplified without bound
WEIGHT_FLOOR = 1e-6

# A byte budget's rates: (dimensions a sub-quantizer, bits a code), i.e. bits a dimension
# 8, 7, 6, 5, 4, 3, 2, 1, 0.5; a group of GROUP consecutive axes shares one.
RATES = ((1, 8), (1, 7), (1, 6), (2, 10), (2, 8), (2, 6), (4, 8), (8, 8), (16, 8))
GROUP = 16

# check_base: passages the probe index holds, of which queries
CHECK_ROWS, CHECK_QUERIES = 256, 16
# check_base: how far the base index's score may be from q . x1, relative to the scores' scale
# (float32 sums in another order: ~1e-6; fast-scan's 8-bit lookup tables: ~1e-2)
BASE_SCORE_TOLERANCE = 1e-4


def code_bytes(spec: str | int, dim: int) -> int:
    """Bytes of residual codes a passage, at most: the stages', or a budget's, which the
    finest rate caps (8 bits a dimension and the scale: a larger budget codes no finer)."""
    if isinstance(spec, int):
        finest = max(bits / dsub for dsub, bits in RATES)
        return min(spec, math.ceil(dim * finest / 8) + SCALE_BYTES)
    return sum(_stage_bytes(m, bits) for m, bits in parse_refine_stages(spec))


def _stage_bytes(m: int, bits: int) -> int:
    """A product quantizer's code size: M codes of `bits`, packed (faiss's code_size)."""
    return (m * bits + 7) // 8


# A stage of the layout: a product quantizer of M sub-quantizers of `bits` over dimensions
# [lo, hi) of the (rotated) residual.
Layout = list[tuple[int, int, int, int]]  # (lo, hi, M, bits) each


def allocate(variances: np.ndarray, budget: int, max_bits: int = 16, spare: int = 0) -> Layout:
    """Reverse water-filling of `budget` - `spare` bytes over axes of these variances (largest
    first): the layout of disjoint stages, consecutive groups of the same rate merged; codes of
    at most `max_bits` (k-means needs a training vector per centroid).

    Raises:
        ConfigError: for a budget below the smallest rate's (0.5 bit a dimension) + `spare`.
    """
    dim = len(variances)
    group = math.gcd(dim, GROUP)
    rates = [(dsub, bits) for dsub, bits in RATES if group % dsub == 0 and bits <= max_bits]
    strength = np.maximum(variances.reshape(-1, group).mean(axis=1), 1e-30)  # (groups,)

    def pick(theta: float) -> list[tuple[int, int]]:
        wanted = 0.5 * np.log2(strength / theta)  # bits a dimension, per group
        return [min(rates, key=lambda r: abs(r[1] / r[0] - w)) for w in wanted]

    def layout(chosen) -> Layout:
        stages, start = [], 0
        for g in range(1, len(chosen) + 1):
            if g == len(chosen) or chosen[g] != chosen[start]:
                dsub, bits = chosen[start]
                lo, hi = start * group, g * group
                stages.append((lo, hi, (hi - lo) // dsub, bits))
                start = g
        return stages

    def cost(stages: Layout) -> int:
        return sum(_stage_bytes(m, bits) for _, _, m, bits in stages)

    coarsest = layout([min(rates, key=lambda r: r[1] / r[0])] * len(strength))
    if cost(coarsest) + spare > budget:
        least = cost(coarsest) + spare
        raise ConfigError(
            f"refine_residual = {budget} bytes is below the coarsest coding of d={dim} "
            f"({least} bytes: 0.5 bit a dimension"
            + (f" and {spare} for the scale" if spare else "")
            + f"). Hint: at least {least}"
        )
    budget -= spare
    # log theta between "every group at the finest rate" and "every group at the coarsest"
    low, high = np.log2(strength.min()) - 20, np.log2(strength.max()) + 2
    for _ in range(60):
        middle = (low + high) / 2
        if cost(layout(pick(2.0**middle))) > budget:
            low = middle
        else:
            high = middle
    return layout(pick(2.0**high))


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

    @classmethod
    def train(cls, spec: str | int, base: faiss.Index, sample: np.ndarray) -> ResidualRefinement:
        """Lays out and trains the stages on what the base index misses of `sample` ((S, D)
        float32), each stage on what the stages before it missed.

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
                sum(_stage_bytes(m, bits) for _, _, m, bits in layout),
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
        refinement = cls(
            spec,
            rotation,
            query_map,
            layout,
            quantizers,
            scaled=isinstance(spec, int),
            codes=np.empty((0, 0), np.uint8),
        )
        refinement._code(residual, train=True)  # (the sample's own codes are not kept)
        refinement.codes = np.empty((0, refinement.code_size), np.uint8)
        return refinement

    @property
    def code_size(self) -> int:
        """Bytes of codes a passage (the stages', then beta's if scaled)."""
        return self._stages_size + SCALE_BYTES * self.scaled

    @property
    def _stages_size(self) -> int:
        return sum(quantizer.code_size for quantizer in self.quantizers)

    def add(self, base: faiss.Index, batch: np.ndarray) -> np.ndarray:
        """Adds (B, D) float32 `batch` to the base index and returns its residual codes,
        (B, code_size) uint8. The base encodes the batch once (for an IVF the list assignment
        is the build's largest cost): its codes are added as they are and decoded for x1."""
        base_codes = base.sa_encode(batch)
        _add_encoded(base, base_codes)
        decoded = base.sa_decode(base_codes)  # x1: (B, D)
        codes = self._code(batch - decoded)
        if not self.scaled:
            return codes
        # beta = argmin |x - (1 + beta) x^|^2, x^ = x1 + r^ (r^ back from the coded space)
        coded = decoded + self.decode(codes) @ self.query_map.T  # T^-1 = (T^-T)^T: (B, D)
        power = np.einsum("bd,bd->b", coded, coded)
        missed = np.einsum("bd,bd->b", batch - coded, coded)
        beta = np.divide(missed, power, out=np.zeros_like(power), where=power > 0)
        beta = np.clip(beta, -1.0, 1.0).astype(np.float16)  # (B,)
        return np.concatenate([codes, beta.view(np.uint8).reshape(len(batch), SCALE_BYTES)], 1)

    def _code(self, residual: np.ndarray, train: bool = False) -> np.ndarray:
        """Codes (B, D) residuals stage by stage, each stage (trained first if `train`) coding
        its dimensions of what the stages before it missed."""
        if self.rotation is not None:
            residual = residual @ self.rotation
        residual = np.array(residual, np.float32)  # a copy, modified below
        parts = []
        for (lo, hi, _, _), quantizer in zip(self.layout, self.quantizers, strict=True):
            mine = np.ascontiguousarray(residual[:, lo:hi])
            if train:
                quantizer.train(mine)
            stage = quantizer.compute_codes(mine)  # (B, code_size)
            residual[:, lo:hi] -= quantizer.decode(stage)
            parts.append(stage)
        return np.concatenate(parts, axis=1)

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

    def check_base(self, index: faiss.Index, factory: str, sample: np.ndarray) -> None:
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

    def save(self, folder: Path) -> None:
        """Writes `refine_codes.npy`, `refine_layout.json`, one `refine_pq<i>.faiss` per stage
        and, for a budget, `refine_rotation.npy` and `refine_query_map.npy` into `folder`."""
        with open(folder / CODES_FILE, "wb") as handle:
            np.save(handle, self.codes, allow_pickle=False)
        for stage, quantizer in enumerate(self.quantizers):
            faiss.write_ProductQuantizer(
                quantizer, str(folder / QUANTIZER_FILE.format(stage=stage))
            )
        if self.rotation is not None:
            for name, array in ((ROTATION_FILE, self.rotation), (QUERY_MAP_FILE, self.query_map)):
                with open(folder / name, "wb") as handle:
                    np.save(handle, array, allow_pickle=False)
        layout = {
            "rotation": self.rotation is not None,
            "weighted": self.rotation is not None,
            "scaled": self.scaled,
            "stages": self.layout,
        }
        (folder / LAYOUT_FILE).write_text(json.dumps(layout) + "\n")

    @classmethod
    def load(cls, folder: Path, spec: str | int, count: int, dim: int) -> ResidualRefinement:
        """Reads what `save` wrote, the codes into RAM (a search reads nothing from disk).

        Raises:
            DataError: for a missing or truncated file, or files that disagree with the index.
        """
        hint = "Hint: rebuild the index with `fid build-index`"

        def required(name: str) -> Path:
            path = folder / name
            if not path.is_file():
                raise DataError(
                    f"{path}: missing; the index was built with refine_residual. {hint}"
                )
            return path

        from fid.text_files import read_json

        saved = read_json(required(LAYOUT_FILE), "a residual refinement's layout (json)")
        try:
            layout = [tuple(int(v) for v in stage) for stage in saved["stages"]]
            rotated = bool(saved["rotation"])
            # (an index built before the weighting and scale: an orthonormal rotation alone)
            weighted, scaled = bool(saved.get("weighted")), bool(saved.get("scaled"))
            assert all(len(stage) == 4 for stage in layout) and layout
        except (KeyError, TypeError, ValueError, AssertionError):
            raise DataError(
                f"{folder / LAYOUT_FILE}: expected {{'rotation': bool, 'stages': [[lo, hi, M, "
                f"bits], ...]}}. {hint}"
            ) from None
        quantizers = []
        for stage, (lo, hi, m, bits) in enumerate(layout):
            path = required(QUANTIZER_FILE.format(stage=stage))
            try:
                quantizer = faiss.read_ProductQuantizer(str(path))
            except RuntimeError as error:
                raise DataError(f"{path}: cannot read: {error}. {hint}") from None
            if (quantizer.d, quantizer.M, quantizer.nbits) != (hi - lo, m, bits) or hi > dim:
                raise DataError(
                    f"{path}: a PQ{quantizer.M}x{quantizer.nbits} of d={quantizer.d}, but "
                    f"{LAYOUT_FILE} says stage {stage} is PQ{m}x{bits} over dimensions {lo}-"
                    f"{hi - 1} of d={dim}. {hint}"
                )
            quantizers.append(quantizer)
        rotation = query_map = None
        if rotated:
            rotation = _load_array(required(ROTATION_FILE), np.float32, (dim, dim), hint)
            query_map = rotation  # orthonormal: its own inverse transposed
        if weighted:
            query_map = _load_array(required(QUERY_MAP_FILE), np.float32, (dim, dim), hint)
        code_size = sum(quantizer.code_size for quantizer in quantizers) + SCALE_BYTES * scaled
        codes = _load_array(required(CODES_FILE), np.uint8, (count, code_size), hint)
        return cls(spec, rotation, query_map, layout, quantizers, scaled, codes)


def _load_array(path: Path, dtype, shape: tuple[int, int], hint: str) -> np.ndarray:
    """A whole .npy of this dtype and shape, in RAM."""
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as error:  # not a .npy, or shorter than its header says
        name = np.dtype(dtype).name
        raise DataError(f"{path}: not a complete {name} .npy array: {error}. {hint}") from None
    if array.dtype != dtype or array.shape != shape:
        raise DataError(
            f"{path}: holds {array.dtype} {array.shape}, but the index expects "
            f"{np.dtype(dtype).name} {shape}. {hint}"
        )
    return array


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
        from fid.retrieval.index import faiss_message

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


__all__ = ["CODES_FILE", "ResidualRefinement", "code_bytes"]
