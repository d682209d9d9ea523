"""An index is searched only with the encoder and the corpus its embeddings came from.

Ranked rows of an index are passage ids; the index cannot tell whether the questions are
encoded by the model that embedded its passages, nor whether the passage file given to read
their text is the one that was embedded. Another encoder of the same width gives answers from
unrelated passages, and another corpus with the same ids hands the reader other texts; both
without an error. So each embedding shard records the fingerprint of its encoder's weights
(fid.models.fingerprint) and the identity of its passage file (size and sampled sha256,
fid.data.passage_store.passages_identity); the index keeps them, and `fid retrieve` and `fid ask`
refuse a mismatch, naming both.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fid.data.passage_store import passages_identity
from fid.errors import DataError
from fid.models.fingerprint import model_fingerprint
from fid.retrieval.index import PassageIndex

logger = logging.getLogger(__name__)


def _short(record: dict) -> str:
    if "weights_sha256" in record:
        return f"weights sha256 {record['weights_sha256'][:12]}"
    if "sampled_sha256" in record:
        return f"{record['bytes']:,} bytes, sampled sha256 {record['sampled_sha256'][:12]}"
    return f"hub name {record.get('name')!r}"


def check_index_sources(
    index: PassageIndex, folder: str | Path, model: str | Path, passages: str | Path | None
) -> None:
    """Refuses an index searched with another encoder, or read with another corpus, than the
    ones its embeddings came from.

    Args:
        index: the loaded index (its `sources` as recorded at build time).
        folder: the index folder (for messages).
        model: the retriever that encodes the questions (folder or hub name).
        passages: the passage TSV or store the ranked ids are read from (None: not read).

    Raises:
        DataError: naming the index, the model or passages given and both fingerprints.
    """
    recorded = index.sources
    if not recorded:
        logger.warning(
            "%s: the index records neither its encoder nor its corpus (built before fid "
            "recorded them): it cannot be checked against %s. Hint: rebuild it", folder, model
        )  # fmt: skip
        return
    encoder = model_fingerprint(model)
    if "encoder" in recorded and recorded["encoder"] != encoder:
        raise DataError(
            f"{folder}: the index holds embeddings of the encoder {index.model} "
            f"({_short(recorded['encoder'])}), but the questions would be encoded by {model} "
            f"({_short(encoder)}): its scores would rank unrelated passages. Hint: give the "
            "retriever the index was built with, or embed the passages again with this one "
            "(fid embed-passages, fid build-index)"
        )
    if passages is None or "corpus" not in recorded:
        return
    corpus = passages_identity(passages)
    if recorded["corpus"] != corpus:
        raise DataError(
            f"{folder}: the index was built from a passage file of {_short(recorded['corpus'])}, "
            f"but the passages given, {passages}, are another file ({_short(corpus)}): the "
            "ids it returns would read other texts. Hint: give the passage file (or its "
            "store) that was embedded, or embed this one and build its index"
        )
