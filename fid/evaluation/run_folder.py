"""What a trained run holds, found from its folder (results/<run>/, as rules/*.smk write it):

iter{i}/reader/model/      round i's reader (fid_reader.json records its settings)
iter{i}/retriever/model/   round i's retriever, distilled from that reader
iter{i}/index/             the faiss index of that retriever's passage embeddings
bm25/index/                BM25's index (bm25/shards/<k>/index/: its shards), which round 0's
                           reader reads with first_retrieval: bm25
<name>/index/              the index of the pretrained encoder `pretrained.<name>` (round 0's
                           with first_retrieval: <name>); the encoder is where the workflow
                           put it, beside results/: resources/pretrained/<name> (a package),
                           resources/models/<hub name, / as --> (a hub model) or its path
config/eval_reader.yaml    the generation knobs (n_passages, max_new_tokens, ...)
config/retrieve.yaml       the search knobs (nprobe, ef_search, shortlist, lengths)
config/bm25.yaml           BM25's knobs (k1, b, method, analysis: what its index was built with)
passages/store/            compact runs: the passage store; else the passage TSV,
                           data/demo/world/passages.tsv, data/scale/psgs_w100.tsv, or
                           `data.passages` of report/config.yaml (relative to the folder
                           that holds results/, where the workflow runs)

Which reader, retriever and index make up the system a run built (what `fid ask --run`
answers with and the report scores) is fid.evaluation.run_system's decision, not this module's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import yaml

from fid.errors import DataError, InputError
from fid.evaluation.run_system import RunSystem, run_system
from fid.text_files import read_text

logger = logging.getLogger(__name__)

# Where a run keeps its passages, most useful first (a store reads by id without a scan).
RUN_PASSAGES = ("passages/store", "data/demo/world/passages.tsv", "data/scale/psgs_w100.tsv")


@dataclass(frozen=True)
class RunPaths:
    """A round's models, index and passages; the configs are None where defaults apply.
    `system`: the run's system they come from (None: every path given, no run); `replaced`:
    a flag replaced its reader, retriever or index (the answers are not the report's). A system
    that reads BM25's lists has no retriever and index but `bm25`: the index folders (one, or
    the shards of a sharded index), with their config `bm25_config`."""

    reader: Path
    retriever: Path | None
    index: Path | None
    passages: Path
    eval_config: Path | None = None
    retrieve_config: Path | None = None
    system: RunSystem | None = None
    bm25: tuple[Path, ...] = ()
    bm25_config: Path | None = None
    replaced: bool = False


def run_paths(run: Path | None, round_: int | None, **given: Path | None) -> RunPaths:
    """The models, index, passages and configs of a run's system (fid.evaluation.run_system:
    the round's reader and the retriever and index whose lists it was scored on), `given` ones
    replacing them.

    Only folder names are resolved here: the loaders check what the folders hold.

    Args:
        run: a run folder (results/<run>) or a run name under ./results; None: `given` names
            all of reader, retriever, index and passages.
        round_: the reader's round i (iter{i}); None: the newest with a trained reader.
        given: reader, retriever, index, passages: paths that replace the run's (None: the
            run's).

    Raises:
        InputError: a run folder that does not exist, a run without a trained round (or
            without `round_`), a round whose lists neither BM25, nor a dense retriever of the
            run, nor a pretrained encoder its config names made, and no --retriever and
            --index, a run whose passages cannot be found; with no run, a missing path.
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
    system = run_system(run, round_)
    dense_given = given["retriever"] is not None and given["index"] is not None
    bm25 = _bm25_indexes(system.run) if system.source == "bm25" and not dense_given else ()
    found = {"reader": system.reader, "retriever": system.retriever, "index": system.index}
    encoder = _pretrained_encoder(system.run, system.source) if system.retriever is None else None
    if encoder is not None:  # round 0 on a pretrained encoder's lists: its index in the run
        found |= {"retriever": encoder, "index": system.run / system.source / "index"}
    if found["retriever"] is None and not dense_given and not bm25:
        raise DataError(
            f"{system.reader}: round {system.round}'s reader was scored on the lists of "
            f"{system.source}, which fid ask cannot search (it answers through BM25's index "
            f"({system.run / 'bm25/index'}), a dense retriever and index of the run, or an "
            "encoder under `pretrained` in the run's report/config.yaml with its index in the "
            f"run, {system.run / system.source / 'index'}). Hint: "
            f"give --retriever and --index (e.g. {system.run / f'iter{system.round}'}'s) to ask "
            "it with those; the report did not score that pair"
        )
    replaced = [f"--{name}" for name in ("reader", "retriever", "index") if given[name]]
    if replaced:
        logger.warning(
            "%s replace the run's system's (%s): the answers are not those the report scored",
            ", ".join(replaced), system.describe(),
        )  # fmt: skip
    paths = {name: given[name] or found[name] for name in found}
    configs = (
        system.run / "config" / f"{stage}.yaml" for stage in ("eval_reader", "retrieve", "bm25")
    )
    eval_config, retrieve_config, bm25_config = (
        path if path.is_file() else None for path in configs
    )
    passages = given["passages"] or _run_passages(system.run)
    return RunPaths(**paths, passages=passages, eval_config=eval_config,
                    retrieve_config=retrieve_config, system=system, bm25=bm25,
                    bm25_config=bm25_config if bm25 else None,
                    replaced=bool(replaced))  # fmt: skip


def _bm25_indexes(run: Path) -> tuple[Path, ...]:
    """The run's BM25 index: bm25/index, or the shards bm25/shards/<k>/index in shard order;
    () when it has none."""
    if (run / "bm25" / "index").is_dir():
        return (run / "bm25" / "index",)
    shards = [path for path in (run / "bm25" / "shards").glob("*/index") if path.is_dir()]
    return tuple(
        sorted(shards, key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0)
    )


def _run_config(run: Path) -> dict:
    """The run's config as the workflow copied it (report/config.yaml); {} when absent."""
    config = run / "report" / "config.yaml"
    if not config.is_file():
        return {}
    try:
        data = yaml.safe_load(read_text(config, "the run's YAML config"))
    except yaml.YAMLError as error:
        raise DataError(f"{config}: not a readable YAML config: {error}") from None
    return data if isinstance(data, dict) else {}


def _pretrained_encoder(run: Path, source: str) -> Path | None:
    """The folder of the encoder `pretrained.<source>` of the run's config, where the workflow
    put it (rules/common.smk's `encoder`; paths relative to the folder holding results/):
    resources/pretrained/<source> for a package's model, resources/models/<folder> for a hub
    name, else the path given. None: the config names no such encoder."""
    pretrained = _run_config(run).get("pretrained")
    spec = pretrained.get(source) if isinstance(pretrained, dict) else None
    if not isinstance(spec, dict):
        return None
    root = run.parent.parent
    if "package" in spec:
        return root / "resources" / "pretrained" / source
    model = spec.get("model")
    if not isinstance(model, str) or not model:
        return None
    path = Path(model) if Path(model).is_absolute() else root / model
    if path.exists():
        return path
    from fid.models.hub_fetch import folder_name

    return root / "resources" / "models" / folder_name(model)


def _run_passages(run: Path) -> Path:
    """The run's passages: a store or TSV it holds, else `data.passages` of its config."""
    for relative in RUN_PASSAGES:
        if (run / relative).exists():
            return run / relative
    config = run / "report" / "config.yaml"
    section = _run_config(run).get("data")
    named = section.get("passages") if isinstance(section, dict) else None
    if not isinstance(named, str) or not named:
        raise DataError(
            f"{run}: no passages found (none of {', '.join(RUN_PASSAGES)}, and no data.passages "
            f"in {config}). Hint: give --passages with the TSV (or store) the index was built from"
        )
    return Path(named) if Path(named).is_absolute() else run.parent.parent / named
