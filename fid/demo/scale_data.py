"""Synthetic data of NQ's shape and size, to test the pipeline at paper scale (`fid make-scale-data`).

Writes a DPR-shaped passage file and NQ-open-shaped question splits whose answers are planted
in the corpus. The texts mean nothing; their shape is DPR's: `psgs_w100.tsv` with the header
`id<TAB>text<TAB>title`, every text double-quoted (`""` for a quote inside), 100 words a passage
except the short tail that ends some articles, titles of 1-4 words shared by an article's
consecutive passages, words drawn from a fixed vocabulary with Zipf frequencies (short words
common), some with a comma, a full stop, brackets, quotes or a tab attached. Questions are
~9 lowercase words (a wh-word, function words and content words) with 1-3 word answers (names,
years, counts). Each answer stands verbatim in `answer_passages` passages beside some of its
question's content words, so DPR's has-answer finds it and BM25 can retrieve it, and
`distractor_passages` more hold some of those words without it; answer words never occur
elsewhere (they are kept out of the filler vocabulary).

Speed and memory: passages are made in chunks of CHUNK_PASSAGES rows, each a few numpy passes
(word ids from one random uint64 each, then one byte gather from a blob holding every word
form); no Python object per word, one per row (its id), one per article (its title). Memory is
that of a chunk plus the questions' plans, whatever the corpus size.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fid.config.demo import ARTICLE_PASSAGES, ScaleDataConfig
from fid.runtime.fileio import atomic_paths
from fid.runtime.progress import progress

logger = logging.getLogger(__name__)

__all__ = ["FILES", "make_scale_data"]

FILES = ("psgs_w100.tsv", "train.jsonl", "dev.jsonl", "test.jsonl", "stats.json")
"""What `make_scale_data` writes into its output folder."""
CHUNK_PASSAGES = 8192  # rows made at once: ~5 MB of text, ~60 MB of numpy temporaries

# The most frequent words, in rank order: real English, so that texts read like text.
_STOPWORD_TEXT = """
the of and in to a was is for on as by with he at from his that it an were are which this be also
has had first or their after its new who they two her she been other when there all during into
not but one have time may years more most only over some would where later up such used many can
about out known then made him three between under while both these city
"""
_STOPWORDS = _STOPWORD_TEXT.split()
_QUESTION_FILLERS = ("the", "of", "in", "is", "was", "a", "to", "did", "does", "for", "on", "by")
_WH = ("who", "when", "what", "where", "how many", "which")
_WH_SHARES = (0.32, 0.2, 0.2, 0.1, 0.1, 0.08)  # roughly NQ's
_MONTHS = "January February March April May June July August September October November December"
_FILLER_WORDS = 200_000  # distinct filler words (stopwords included)
_NAME_WORDS = 20_000  # capitalised answer words, never in filler text
_MIN_CONTENT_RANK = 500  # question content words are rarer than this: BM25 weighs them
_VOCABULARY_SEED = 20_181_220  # fixed: every seed writes the same words (DPR's dump date)
_WORD_BITS = 22  # the Zipf table has 2**22 slots: a word's probability is a multiple of 2**-22
_VARIANT_BITS = 16
# Forms of a filler word: (before, after, how many of 2**16 draws take it), csv-escaped (a quote
# in a quoted field is doubled): ~6.5% of words carry a comma, ~0.8% quotes, ~0.02% a tab.
_VARIANTS = (("", "", 0), ("", ",", 4260), ("", ".", 2949), ('""', '""', 524), ("(", ")", 983),
             ("", "\t", 16))  # fmt: skip
_ONSETS = "b c d f g h k l m n p r s t v w z br dr gr st th tr"
_VOWELS = "a e i o u ai ea ou"


@dataclass(frozen=True)
class _Vocabulary:
    blob: np.ndarray  # uint8: every token's bytes followed by a space
    start: np.ndarray  # int64 [token]: offset in blob
    length: np.ndarray  # int64 [token]: bytes, trailing space included
    table: np.ndarray  # int64 [2**_WORD_BITS]: filler word of each slot (Zipf)
    variants: np.ndarray  # int64 [2**_VARIANT_BITS]: variant of each slot
    words: list[str]  # filler words by rank
    names: np.ndarray  # token ids of the capitalised answer words
    years: np.ndarray  # token ids of "1000".."2019"
    counts: np.ndarray  # token ids of "2".."999"
    months: np.ndarray  # token ids of the month names


def _bytes_table(pieces: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blob, start, length) of byte strings laid end to end, for `_gather`."""
    length = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    return np.frombuffer(b"".join(pieces), np.uint8), np.cumsum(length) - length, length


@functools.cache
def _vocabulary() -> _Vocabulary:
    """The fixed vocabulary (~1 s once per process): pseudo-words from syllables, by rank."""
    rng = np.random.default_rng(_VOCABULARY_SEED)
    onsets, vowels = _ONSETS.split(), _VOWELS.split()
    codas = ["", "", "n", "r", "s", "l", "st"]
    syllables = list(dict.fromkeys(o + v + c for o in onsets for v in vowels for c in codas))
    # Candidate words are syllable runs joined by numpy, then split and deduplicated in C.
    n_draw = (_FILLER_WORDS + _NAME_WORDS) * 5 // 4
    n_syllables = rng.choice(4, size=n_draw, p=[0.12, 0.5, 0.3, 0.08]) + 1
    picks = np.concatenate([rng.integers(0, len(syllables), size=(n_draw, 4)),
                            np.full((n_draw, 1), len(syllables))], axis=1)  # fmt: skip
    keep = np.arange(5) < n_syllables[:, None]
    keep[:, 4] = True  # the space after each word
    blob, start, length = _bytes_table([s.encode() for s in [*syllables, " "]])
    candidates = _gather(blob, start[picks[keep]], length[picks[keep]]).tobytes().decode().split()
    taken = {*_STOPWORDS, *_MONTHS.lower().split()}
    pseudo = [w for w in dict.fromkeys(candidates) if w not in taken]
    n_pseudo = _FILLER_WORDS - len(_STOPWORDS)
    if len(pseudo) < n_pseudo + _NAME_WORDS:
        raise RuntimeError(f"only {len(pseudo)} distinct pseudo-words: draw more")  # a bug
    names = [w.capitalize() for w in pseudo[n_pseudo : n_pseudo + _NAME_WORDS]]
    pseudo = sorted(pseudo[:n_pseudo], key=len)  # short words are the common ones (Zipf)
    for i in np.flatnonzero(rng.random(n_pseudo) < 0.03).tolist():  # some UTF-8 (has-answer: NFD)
        pseudo[i] = pseudo[i].replace("e", "é", 1)
    words = _STOPWORDS + pseudo
    # Every form of every word (token rank * len(_VARIANTS) + form), then the answer words.
    blob, start, length = _bytes_table(
        [w.encode() for w in words]
        + [p.encode() for pre, post, _ in _VARIANTS for p in (pre, post + " ")]
    )
    before = len(words) + 2 * np.arange(len(_VARIANTS))  # each form's pieces: before, word, after
    word = np.arange(len(words))[:, None]
    parts = np.stack(np.broadcast_arrays(before, word, before + 1), axis=2).reshape(-1)
    forms = _gather(blob, start[parts], length[parts])
    form_length = length[parts].reshape(-1, 3).sum(axis=1)
    extra = names + [str(y) for y in range(1000, 2020)] + [str(c) for c in range(2, 1000)]
    extra_blob, _, extra_length = _bytes_table(
        [(w + " ").encode() for w in extra + _MONTHS.split()]
    )
    length = np.concatenate([form_length, extra_length])
    probability = 1 / (np.arange(len(words)) + 2.7)
    slots = np.maximum(1, np.round(probability / probability.sum() * 2**_WORD_BITS)).astype(int)
    slots[0] -= slots.sum() - 2**_WORD_BITS  # the table must fill the random bits exactly
    shares = [n for _, _, n in _VARIANTS]
    shares[0] = 2**_VARIANT_BITS - sum(shares)
    first = form_length.size
    years, counts = first + len(names), first + len(names) + 1020
    return _Vocabulary(
        blob=np.concatenate([forms, extra_blob]),
        start=np.cumsum(length) - length,
        length=length,
        table=np.repeat(np.arange(len(words)), slots),
        variants=np.repeat(np.arange(len(_VARIANTS)), shares),
        words=words,
        names=np.arange(first, years),
        years=np.arange(years, counts),
        counts=np.arange(counts, counts + 998),
        months=np.arange(counts + 998, length.size),
    )


def _rare_words(rng: np.random.Generator, vocab: _Vocabulary, n: int, min_rank: int) -> np.ndarray:
    """`n` filler word ranks drawn by frequency among the words of rank >= `min_rank`."""
    found = np.empty(0, dtype=np.int64)
    while found.size < n:
        draw = vocab.table[rng.integers(0, vocab.table.size, size=2 * n + 16)]
        found = np.concatenate([found, draw[draw >= min_rank]])
    return found[:n]


def _distinct(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """`k` distinct integers of [0, n) in random order, in O(k) memory when k << n."""
    if 2 * k > n:
        return rng.permutation(n)[:k]
    picked = np.unique(rng.integers(0, n, size=k))
    while picked.size < k:
        picked = np.unique(np.concatenate([picked, rng.integers(0, n, size=k - picked.size)]))
    return rng.permutation(picked)


@dataclass
class _Questions:
    """All questions: texts, answers, and the tokens their answer passages get."""

    records: list[dict]  # {"question", "answer"} in split order (train, dev, test)
    answers: list[np.ndarray]  # answer token ids (plain forms: ranks * len(_VARIANTS))
    content: list[np.ndarray]  # token ids of the question's content words


def _make_questions(rng: np.random.Generator, vocab: _Vocabulary, n: int) -> _Questions:
    """`n` questions: a wh-word, then ~8 words, half of them content words, shuffled."""
    wh = rng.choice(len(_WH), size=n, p=_WH_SHARES)
    body = np.clip(np.round(rng.normal(8.0, 2.2, size=n)), 3, 18).astype(int)
    n_content = np.clip(np.round(body * 0.5), 2, 6).astype(int)
    content_words = _rare_words(rng, vocab, int(n_content.sum()), _MIN_CONTENT_RANK)
    bounds = np.cumsum(n_content) - n_content
    names = vocab.names[rng.integers(0, vocab.names.size, size=(n, 3))]
    n_names = rng.choice(3, size=n, p=[0.45, 0.35, 0.2]) + 1
    fillers = rng.integers(0, len(_QUESTION_FILLERS), size=(n, 18)).tolist()
    orders = rng.random((n, 18)).argsort(axis=1).tolist()
    coin = rng.random(n)
    numbers = rng.integers(0, 1 << 30, size=n)
    records, answers, content = [], [], []
    for i in range(n):
        kind = _WH[wh[i]]
        if kind == "when":
            year = vocab.years[numbers[i] % vocab.years.size]
            month = vocab.months[numbers[i] // vocab.years.size % vocab.months.size]
            answer = np.array([year] if coin[i] < 0.7 else [month, year])
        elif kind == "how many":
            answer = np.array([vocab.counts[numbers[i] % vocab.counts.size]])
        else:  # who: a person's 2-3 names; what, where, which: 1-3 name words
            answer = names[i, : max(n_names[i], 2) if kind == "who" else n_names[i]]
        k = n_content[i]
        ranks = content_words[bounds[i] : bounds[i] + k]
        words = [vocab.words[r] for r in ranks.tolist()] + [
            _QUESTION_FILLERS[f] for f in fillers[i][: body[i] - k]
        ]
        words = [words[j] for j in orders[i] if j < body[i]]
        text = " ".join(_token_text(vocab, t) for t in answer.tolist())
        records.append({"question": f"{kind} {' '.join(words)}", "answer": [text]})
        answers.append(answer)
        content.append(ranks * len(_VARIANTS))
    return _Questions(records, answers, content)


def _token_text(vocab: _Vocabulary, token: int) -> str:
    start = vocab.start[token]
    return vocab.blob[start : start + vocab.length[token] - 1].tobytes().decode()


class _Articles:
    """Consecutive passages grouped into articles: each passage's article, place in it, word
    count (an article's last passage is sometimes a short tail), and each article's title."""

    def __init__(self, rng: np.random.Generator, vocab: _Vocabulary, cfg: ScaleDataConfig):
        self.rng, self.vocab, self.words = rng, vocab, cfg.passage_words
        self.tail_chance = cfg.tail_fraction * ARTICLE_PASSAGES
        self.article = self.place = self.n_words = np.empty(0, dtype=np.int64)
        self.titles: dict[int, bytes] = {}
        self.drawn = 0  # articles drawn so far

    def _draw(self, n: int) -> None:
        rng, vocab = self.rng, self.vocab
        sizes = rng.geometric(1 / ARTICLE_PASSAGES, size=n)
        ends = np.cumsum(sizes)
        article = np.repeat(np.arange(self.drawn, self.drawn + n), sizes)
        place = np.arange(ends[-1]) - np.repeat(ends - sizes, sizes)
        n_words = np.full(ends[-1], self.words)
        tails = ends[rng.random(n) < self.tail_chance] - 1
        n_words[tails] = rng.integers(1, self.words, size=tails.size)
        n_title = rng.choice(4, size=n, p=[0.2, 0.4, 0.25, 0.15]) + 1
        ranks = _rare_words(rng, vocab, int(n_title.sum()), len(_STOPWORDS)).tolist()
        at = 0
        for a, k in enumerate(n_title.tolist(), start=self.drawn):
            title = " ".join(vocab.words[r].capitalize() for r in ranks[at : at + k])
            self.titles[a] = f'"\t{title}\n'.encode()  # closes the text, then the title column
            at += k
        self.article = np.concatenate([self.article, article])
        self.place = np.concatenate([self.place, place])
        self.n_words = np.concatenate([self.n_words, n_words])
        self.drawn += n

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[bytes]]:
        """The next `n` passages: (article, place, n_words, titles of article[0]..article[-1])."""
        while self.article.size < n:
            self._draw(n // ARTICLE_PASSAGES + 1)
        out = self.article[:n], self.place[:n], self.n_words[:n].copy()
        self.article, self.place, self.n_words = (
            a[n:] for a in (self.article, self.place, self.n_words)
        )
        first, last = int(out[0][0]), int(out[0][-1])
        titles = [self.titles[a] for a in range(first, last + 1)]
        for a in range(first, last):
            del self.titles[a]
        return *out, titles


def _gather(source: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The bytes source[start[i] : start[i] + length[i]] of every i, concatenated."""
    offset = np.cumsum(length) - length
    return source[np.repeat(start - offset, length) + np.arange(int(length.sum()))]


def _plant(rng: np.random.Generator, words: np.ndarray, answer: np.ndarray, content: np.ndarray):
    """Puts the answer (contiguous; none in a distractor) and half or more of the question's
    content words (each somewhere else) into one passage's word tokens, in place."""
    at = int(rng.integers(0, words.size - answer.size + 1))
    words[at : at + answer.size] = answer
    free = np.delete(np.arange(words.size), np.s_[at : at + answer.size])
    m = int(rng.integers((content.size + 1) // 2, content.size + 1))
    words[rng.choice(free, size=m, replace=False)] = rng.choice(content, size=m, replace=False)


def _write_passages(handle, cfg: ScaleDataConfig, n: int, questions: _Questions, hosts, rngs):
    """Writes the passage file's rows chunk by chunk; returns its counts for stats.json.

    `hosts` is (passage index, question, answer or distractor) of every passage that gets a
    question's words, sorted by passage.
    """
    vocab = _vocabulary()
    host_passage, host_question, host_answers = hosts
    n_answer = np.array([a.size for a in questions.answers])
    n_content = np.array([c.size for c in questions.content])
    no_answer = np.empty(0, dtype=np.int64)
    articles = _Articles(rngs["articles"], vocab, cfg)
    word_mask, variant_mask = (1 << _WORD_BITS) - 1, (1 << _VARIANT_BITS) - 1
    # One buffer holds every word form, then the chunk's row starts and title ends.
    source = np.concatenate([vocab.blob, np.empty(CHUNK_PASSAGES * 64, dtype=np.uint8)])
    n_short = n_words_total = 0
    handle.write(b"id\ttext\ttitle\n")
    bar = progress(desc="scale data", unit="passages", total=n, log=logger)
    for begin in range(0, n, CHUNK_PASSAGES):
        count = min(CHUNK_PASSAGES, n - begin)
        article, place, n_words, titles = articles.take(count)
        lo, hi = np.searchsorted(host_passage, [begin, begin + count])
        planted, planted_question = host_passage[lo:hi] - begin, host_question[lo:hi]
        answers = host_answers[lo:hi]
        need = n_content[planted_question] + answers * n_answer[planted_question]
        n_words[planted] = np.maximum(n_words[planted], need)
        n_short += int((n_words < cfg.passage_words).sum())
        n_words_total += int(n_words.sum())

        raw = rngs["words"].bit_generator.random_raw(int(n_words.sum()))
        tokens = vocab.table[raw & word_mask] * len(_VARIANTS)
        tokens += vocab.variants[(raw >> _WORD_BITS) & variant_mask]
        word_start = np.cumsum(n_words) - n_words
        for p, q, a in zip(
            planted.tolist(), planted_question.tolist(), answers.tolist(), strict=True
        ):
            words = tokens[word_start[p] : word_start[p] + n_words[p]]
            answer = questions.answers[q] if a else no_answer
            _plant(rngs["plants"], words, answer, questions.content[q])

        # A row is its start (id, tab, quote), its words, its end (quote, tab, title, newline).
        if cfg.integer_ids:
            starts = [f'{i}\t"' for i in range(begin + 1, begin + count + 1)]
        else:
            starts = [
                f'doc{a}-{k}\t"' for a, k in zip(article.tolist(), place.tolist(), strict=True)
            ]
        extra = "".join(starts).encode() + b"".join(titles)
        if source.size < vocab.blob.size + len(extra):
            source = np.concatenate([vocab.blob, np.empty(2 * len(extra), dtype=np.uint8)])
        source[vocab.blob.size : vocab.blob.size + len(extra)] = np.frombuffer(extra, np.uint8)
        start_length = np.fromiter(map(len, starts), dtype=np.int64, count=count)
        end_length = np.fromiter(map(len, titles), dtype=np.int64, count=len(titles))
        end_start = vocab.blob.size + start_length.sum() + np.cumsum(end_length) - end_length
        row_start = np.cumsum(n_words + 2) - (n_words + 2)
        row_end = row_start + n_words + 1
        is_word = np.ones(int(row_end[-1]) + 1, dtype=bool)
        is_word[row_start] = is_word[row_end] = False
        start, length = np.empty(is_word.size, np.int64), np.empty(is_word.size, np.int64)
        start[is_word], length[is_word] = vocab.start[tokens], vocab.length[tokens]
        length[row_end - 1] -= 1  # no space after a text's last word
        start[row_start] = vocab.blob.size + np.cumsum(start_length) - start_length
        length[row_start] = start_length
        title = article - article[0]
        start[row_end], length[row_end] = end_start[title], end_length[title]
        handle.write(_gather(source, start, length))
        bar.update(count)
    bar.close()
    n_articles = int(article[-1]) + 1
    return dict(passages=n, articles=n_articles, short_passages=n_short, words=n_words_total)


def make_scale_data(cfg: ScaleDataConfig, output: Path) -> dict:
    """Writes a DPR-shaped corpus and NQ-open-shaped question splits with planted answers.

    Writes, into `output/` (created if missing; the files appear together, when all are
    written): `psgs_w100.tsv` (DPR's passage format), `train.jsonl`, `dev.jsonl`, `test.jsonl`
    (NQ-open: one `{"question": ..., "answer": [...]}` per line) and `stats.json`. Every byte
    but stats.json's timings is a function of `cfg`.

    Args:
        cfg: sizes (`cfg.sizes()`), seed and shape of the data.
        output: the folder to write into.

    Returns:
        What stats.json holds: the counts ("passages", "articles", "short_passages", "words",
        "answer_passages", "distractor_passages", "questions" by split), "bytes" by file,
        "seconds" (passages, questions, total) and the config.
    """
    began = time.perf_counter()
    output = Path(output)
    sizes = cfg.sizes()
    names = ("questions", "plants", "articles", "words")
    rngs = {name: np.random.default_rng([cfg.seed, k]) for k, name in enumerate(names)}
    splits = {split: sizes[split] for split in ("train", "dev", "test")}
    questions = _make_questions(rngs["questions"], _vocabulary(), sum(splits.values()))
    # Answer and distractor passages, all distinct: a passage holds one question's words.
    per_question = cfg.answer_passages + cfg.distractor_passages
    n_hosts = len(questions.records) * per_question
    host_passage = _distinct(rngs["plants"], sizes["passages"], n_hosts)
    order = np.argsort(host_passage, kind="stable")
    hosts = host_passage[order], order // per_question, order % per_question < cfg.answer_passages
    with atomic_paths(*(output / name for name in FILES)) as tmps:
        paths = dict(zip(FILES, tmps, strict=True))
        with open(paths["psgs_w100.tsv"], "wb") as handle:
            stats = _write_passages(handle, cfg, sizes["passages"], questions, hosts, rngs)
        passages_done = time.perf_counter()
        at = 0
        for split, n in splits.items():
            with open(paths[f"{split}.jsonl"], "w", encoding="utf-8", newline="") as handle:
                for record in questions.records[at : at + n]:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            at += n
        done = time.perf_counter()
        seconds = {"passages": passages_done - began, "questions": done - passages_done}
        stats.update(
            answer_passages=len(questions.records) * cfg.answer_passages,
            distractor_passages=len(questions.records) * cfg.distractor_passages,
            questions=splits,
            bytes={name: paths[name].stat().st_size for name in FILES[:-1]},
            seconds={k: round(v, 3) for k, v in {**seconds, "total": done - began}.items()},
            config=dataclasses.asdict(cfg),
        )
        paths["stats.json"].write_text(json.dumps(stats, indent=2) + "\n")
    logger.info(
        "wrote %d passages (%.0f MB) and %s questions to %s in %.1f s",
        stats["passages"], stats["bytes"]["psgs_w100.tsv"] / 1e6, splits, output,
        stats["seconds"]["total"],
    )  # fmt: skip
    return stats
