"""What a trained run holds, found from its folder (results/<run>/, as rules/*.smk write it):

iter{i}/reader/model/      round i's reader (fid_reader.json records its settings)
iter{i}/retriever/model/   round i's retriever, distilled from that reader
iter{i}/index/             the faiss index of that retriever's passage embeddings
config/eval_reader.yaml    the generation knobs (n_passages, max_new_tokens, ...)
config/retrieve.yaml       the search knobs (nprobe, ef_search, shortlist, lengths)
passages/store/            compact runs: the passage store; else the passage TSV,
                           data/demo/world/passages.tsv, data/scale/psgs_w100.tsv, or
                           `data.passages` of report/config.yaml (relative to the folder
                           that holds results/, where the workflow runs)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from fid.errors import DataError, InputError
from fid.text_files import read_text

# Where a run keeps its passages, most useful first (a store reads by id without a scan).
RUN_PASSAGES = ("passages/store", "data/demo/world/passages.tsv", "data/scale/psgs_w100.tsv")


@dataclass(frozen=True)
class RunPaths:
    """A round's models, index and passages; the configs are None where defaults apply."""

    reader: Path
    retriever: Path
    index: Path
    passages: Path
    eval_config: Path | None = None
    retrieve_config: Path | None = None


def run_paths(run: Path | None, round_: int | None, **given: Path | None) -> RunPaths:
    """The models, index, passages and configs of a run's round, `given` ones replacing them.

    Only folder names are resolved here: the loaders check what the folders hold.

    Args:
        run: a run folder (results/<run>) or a run name under ./results; None: `given` names
            all of reader, retriever, index and passages.
        round_: the round i (iter{i}); None: the newest with a trained reader.
        given: reader, retriever, index, passages: paths that replace the run's (None: the
            run's).

    Raises:
        InputError: a run folder that does not exist, a run without a trained round (or
            without `round_`), a run whose passages cannot be found; with no run, a missing
            path.
    """
    if run is None:
        missing = [f"--{name}" for name, path in given.items() if path is None]
        if missing or round_ is not None:
            raise InputError(
                "fid ask: give --run (a run folder such as results/demo), or all of --reader, "
                f"--retriever, --index and --passages (missing: {', '.join(missing) or 'none'}"
                f"{'; --round needs --run' if round_ is not None else ''})"
            )
        return RunPaths(**given)
    run = _run_folder(run)
    i = _round(run, round_)
    found = {"reader": f"iter{i}/reader/model", "retriever": f"iter{i}/retriever/model",
             "index": f"iter{i}/index"}  # fmt: skip
    paths = {name: given[name] or run / path for name, path in found.items()}
    configs = (run / "config" / f"{stage}.yaml" for stage in ("eval_reader", "retrieve"))
    eval_config, retrieve_config = (path if path.is_file() else None for path in configs)
    passages = given["passages"] or _run_passages(run)
    return RunPaths(**paths, passages=passages, eval_config=eval_config,
                    retrieve_config=retrieve_config)  # fmt: skip


def _run_folder(run: Path) -> Path:
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


def _run_passages(run: Path) -> Path:
    """The run's passages: a store or TSV it holds, else `data.passages` of its config."""
    for relative in RUN_PASSAGES:
        if (run / relative).exists():
            return run / relative
    config, named = run / "report" / "config.yaml", None
    if config.is_file():
        text = read_text(config, "the run's YAML config")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise DataError(f"{config}: not a readable YAML config: {error}") from None
        section = data.get("data") if isinstance(data, dict) else None
        named = section.get("passages") if isinstance(section, dict) else None
    if not isinstance(named, str) or not named:
        raise DataError(
            f"{run}: no passages found (none of {', '.join(RUN_PASSAGES)}, and no data.passages "
            f"in {config}). Hint: give --passages with the TSV (or store) the index was built from"
        )
    return Path(named) if Path(named).is_absolute() else run.parent.parent / named
