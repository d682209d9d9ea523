"""Knobs of the data commands: `fid download`, `prepare-questions`, `make-reader-lists`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fid.config.loading import ConfigError


@dataclass(frozen=True)
class DownloadConfig:
    """`fid download`: how hard to try. None of these changes what is downloaded, so none of
    them makes a finished download run again (rules/data.smk).

    Attributes:
        timeout_s: seconds a connection may stay silent before the attempt is abandoned.
        retries: further attempts after failed ones in a row; an attempt that received bytes
            starts the count (and the pause) afresh, so a slow, often dropped transfer of a
            large file goes on as long as it progresses.
        retry_wait_s: pause before the first retry; doubled for each further one ...
        max_retry_wait_s: ... up to this ceiling.
        chunk_bytes: bytes read and written at a time. (Progress is logged as every long
            loop's is: at most every FID_PROGRESS_INTERVAL_S seconds, on the job's console.)
    """

    timeout_s: float = 60.0
    retries: int = 5
    retry_wait_s: float = 2.0
    max_retry_wait_s: float = 60.0
    chunk_bytes: int = 1 << 20

    def __post_init__(self):
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s = {self.timeout_s!r} is out of range: expected > 0")
        for name in ("retries",):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"{name} = {getattr(self, name)!r} is out of range: expected >= 0"
                )
        if self.retry_wait_s < 0:
            raise ConfigError(
                f"retry_wait_s = {self.retry_wait_s!r} is out of range: expected >= 0"
            )
        if self.max_retry_wait_s < self.retry_wait_s:
            raise ConfigError(
                f"max_retry_wait_s = {self.max_retry_wait_s!r} is out of range: expected >= "
                f"retry_wait_s ({self.retry_wait_s!r})"
            )
        for name in ("chunk_bytes",):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"{name} = {getattr(self, name)!r} is out of range: expected >= 1"
                )


@dataclass(frozen=True)
class PrepareQuestionsConfig:
    """`fid prepare-questions`: which records of a raw question file form a split.

    Attributes:
        shuffle_seed: shuffle the records (after the index selection) with this seed before
            taking the fraction; None keeps the file order.
        select_from, select_to: keep records [from * n, to * n) of the (shuffled) records, so
            that e.g. 0-0.8 / 0.8-0.9 / 0.9-1 with one seed cut one file into disjoint splits.
        max_questions: keep at most this many (the first ones) afterwards.
        drop_unlabeled: drop questions without answers (training needs answers).
        triviaqa_target: the training target of a raw TriviaQA question: "value" (FiD's
            src/preprocess.py: `Answer.Value`, title-cased when it is all upper case, kept as
            the record's `target`) or "random_alias" (no target: training draws one of the
            aliases). Either way every alias is an answer that evaluation accepts.
        accept_other_size: write a split whose size is not `--expected-size` with a warning
            (default: refused, naming both numbers: days of training on a wrong split cost
            more than a stop).
    """

    shuffle_seed: int | None = None
    select_from: float = 0.0
    select_to: float = 1.0
    max_questions: int | None = None
    drop_unlabeled: bool = False
    triviaqa_target: Literal["value", "random_alias"] = "value"
    accept_other_size: bool = False

    def __post_init__(self):
        if not 0.0 <= self.select_from < self.select_to <= 1.0:
            raise ConfigError(
                f"select_from = {self.select_from!r}, select_to = {self.select_to!r} are out of "
                "range: expected 0 <= select_from < select_to <= 1"
            )
        if self.max_questions is not None and self.max_questions < 1:
            raise ConfigError(
                f"max_questions = {self.max_questions!r} is out of range: expected >= 1 or null"
            )


@dataclass(frozen=True)
class ReaderListsConfig:
    """`fid make-reader-lists`: retrieved lists with the gold passage forced in.

    For the demo's curriculum only (its questions know their gold passage): a reader trained
    from scratch learns to tell the gold passage from the retriever's distractors, among them
    passages of other entities, which it must also reject when it later scores passages for
    the retriever.

    Attributes:
        n_passages: passages per question: the gold one and the best retrieved others.
        shuffle: shuffle each list (seeded per question), so a position tells nothing; the
            retrieval scores are dropped so the reader keeps this order.
        seed: seed of the shuffle.
    """

    n_passages: int = 5
    shuffle: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.n_passages < 1:
            raise ConfigError(f"n_passages = {self.n_passages!r} is out of range: expected >= 1")
