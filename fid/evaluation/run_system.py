"""The system a run built: the one reader, retriever, index and passage count that `fid ask
--run` answers with and whose exact match is the report's headline (its "system" line and
report/system.json).

Decision. A run's system is its last trained round's reader, reading the top `n_passages`
(config/eval_reader.yaml) of the lists of the retriever it is evaluated with: round i's reader
reads the lists it was trained on, those of the first retrieval for round 0 (BM25 or a
pretrained encoder, `first_retrieval`) and of the retriever distilled in round i-1 (iter{i-1})
after. The retriever distilled in the last round is not part of it: no reader was trained on or
scored with its lists (it shows in the report's retrieval table, and is what the next round,
were there one, would read). So for the demo's two rounds the system is round 1's reader with
round 0's retriever and index, and `fid ask` answers the test questions as the report scored
them (tests/workflow/test_rebuild.py::test_ask_answers_as_the_report_scored).

The workflow takes the same rule from here (`lists_source`, used by rules/common.smk's
`round_source`), so that what is evaluated and what is asked cannot drift apart.

Standard library and YAML only: the workflow imports this at DAG time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fid.errors import DataError
from fid.text_files import read_text


def lists_source(round_: int, first_retrieval: str) -> str:
    """The retrieval source whose lists round `round_`'s reader reads (and is scored on): the
    first retrieval for round 0, else the retriever distilled in the round before."""
    return first_retrieval if int(round_) == 0 else f"iter{int(round_) - 1}"


@dataclass(frozen=True)
class RunSystem:
    """What a run built, as folders of the run (results/<run>/).

    Attributes:
        run: the run folder.
        round: the reader's round i.
        reader: iter{i}/reader/model.
        source: the retrieval source whose lists the reader reads ("iter0", "bm25", ...).
        retriever: the source's dense encoder (iter{i-1}/retriever/model); None when the source
            is not a retriever of the run (BM25, a pretrained encoder: round 0).
        index: that retriever's faiss index (iter{i-1}/index), or None.
        n_passages: passages read per question (config/eval_reader.yaml), None: the run has no
            such file (the reader's own, fid_reader.json).
    """

    run: Path
    round: int
    reader: Path
    source: str
    retriever: Path | None
    index: Path | None
    n_passages: int | None

    def lists(self, split: str) -> Path:
        """The lists the reader reads for a split (the workflow's rule retrieve writes them)."""
        return self.run / self.source / "retrieval" / f"{split}.json"

    def predictions(self, split: str) -> Path:
        """The reader's answers on those lists (rule eval_reader)."""
        return self.run / f"iter{self.round}" / "reader" / "eval" / f"{split}.predictions.jsonl"

    def metrics(self, split: str) -> Path:
        """Their exact match and F1 (rule eval_reader): the report's headline."""
        return self.run / f"iter{self.round}" / "reader" / "eval" / f"{split}.json"

    def describe(self) -> str:
        """One line: round 1's reader (its folder) reading the top 5 passages of round 0's
        distilled retriever (its index)."""
        if self.source.startswith("iter"):
            lists = f"round {self.source[4:]}'s distilled retriever (its index {self.index})"
        else:
            lists = f"the first retrieval, {self.source}"
        top = f"the top {self.n_passages} passages" if self.n_passages else "the top passages"
        return f"round {self.round}'s reader ({self.reader}) reading {top} of {lists}"

    def headline(self, metrics: dict[str, dict]) -> dict:
        """The report's system.json: the system, the command that asks it, its exact match
        and F1 by split (`metrics`: eval-reader's metrics of `self.metrics(split)`), and the
        headline sentence (on the test split when there is one)."""
        em = {split: m["exact_match"] for split, m in metrics.items()}
        split = "test" if "test" in em else next(iter(em))
        others = ", ".join(f"{s} {value:.2f}%" for s, value in em.items() if s != split)
        ask = f"fid ask --run {self.run}"
        return {
            "headline": f"Headline: the system this run built, {self.describe()}, answers "
            f"{em[split]:.2f}% of the {split} questions exactly{f' ({others})' if others else ''}."
            f" `{ask}` answers with this system (report/system.json lists it).",
            "system": self.describe(), "ask": ask, "round": self.round,
            "reader": str(self.reader), "lists": self.source,
            "retriever": self.retriever and str(self.retriever),
            "index": self.index and str(self.index), "n_passages": self.n_passages,
            "exact_match": em, "f1": {split: m["f1"] for split, m in metrics.items()},
            "predictions": {split: str(self.predictions(split)) for split in metrics},
        }  # fmt: skip


def run_system(
    run: Path, round_: int | None = None, first_retrieval: str | None = None
) -> RunSystem:
    """The system a run folder holds (see the module docstring): a `RunSystem`.

    Only folder names are resolved here: the loaders check what the folders hold.

    Args:
        run: a run folder (results/<run>) or a run name under ./results.
        round_: the reader's round; None: the newest with a trained reader (the last round of
            a finished run).
        first_retrieval: the run's `first_retrieval`, read for round 0 only; None: from the
            run's report/config.yaml, else "the first retrieval".

    Raises:
        DataError: a run folder that does not exist, or without a trained reader (or without
            round `round_`'s).
    """
    run = run_folder(run)
    i = _round(run, round_)
    # the run's config is read for round 0 only: later rounds read a retriever of the run
    first = (first_retrieval or _first_retrieval(run)) if i == 0 else ""
    source = lists_source(i, first)
    dense = source.startswith("iter")
    return RunSystem(
        run=run,
        round=i,
        reader=run / f"iter{i}" / "reader" / "model",
        source=source,
        retriever=run / source / "retriever" / "model" if dense else None,
        index=run / source / "index" if dense else None,
        n_passages=_n_passages(run / "config" / "eval_reader.yaml"),
    )


def run_folder(run: Path) -> Path:
    """`run` as a folder: as given, or results/<run> for a bare name."""
    if not run.is_dir() and len(run.parts) == 1 and (Path("results") / run).is_dir():
        run = Path("results") / run
    if not run.is_dir():
        raise DataError(
            f"{run}: run folder not found: expected a folder the workflow writes (results/<run>, "
            "holding iter<i>/reader/model, iter<i>/retriever/model and iter<i>/index)"
        )
    return run


def _round(run: Path, wanted: int | None) -> int:
    """`wanted`, else the newest round with a reader (a round in progress has it first)."""
    found = (re.fullmatch(r"iter(\d+)", path.name) for path in run.glob("iter*"))
    rounds = sorted(int(m[1]) for m in found if m and (run / m[0] / "reader/model").is_dir())
    if not rounds:
        raise DataError(
            f"{run}: no trained round: no iter<i>/reader/model folder (the workflow's "
            "train_reader writes it). Hint: run the workflow (snakemake) to the end first"
        )
    if wanted is not None and wanted not in rounds:
        raise DataError(
            f"{run / f'iter{wanted}' / 'reader/model'}: round {wanted} has no trained reader "
            f"(trained rounds: {', '.join(map(str, rounds))})"
        )
    return rounds[-1] if wanted is None else wanted


def _first_retrieval(run: Path) -> str:
    """`first_retrieval` of the run's config (report/config.yaml), else a placeholder."""
    import yaml

    config = run / "report" / "config.yaml"
    if config.is_file():
        try:
            data = yaml.safe_load(read_text(config, "the run's YAML config"))
        except yaml.YAMLError as error:
            raise DataError(f"{config}: not a readable YAML config: {error}") from None
        named = data.get("first_retrieval") if isinstance(data, dict) else None
        if isinstance(named, str) and named:
            return named
    return "the first retrieval"


def _n_passages(config: Path) -> int | None:
    """n_passages of the run's eval_reader.yaml (its default when the file omits it)."""
    if not config.is_file():
        return None
    from fid.config import EvalReaderConfig, load_config

    return load_config(config, EvalReaderConfig).n_passages
