"""Every knob of every `fid` subcommand, as typed, frozen dataclasses loaded from YAML.

Paths come from the command line; knobs come from the YAML file given by `--config`, whose keys
are exactly the fields of the subcommand's dataclass. Defaults live in the dataclasses only.
The classes live by stage (reader, retriever, bm25, retrieval, training, data, demo); import
them from here.
"""

from fid.config.bm25 import BM25Config
from fid.config.data import DownloadConfig, PrepareQuestionsConfig, ReaderListsConfig
from fid.config.demo import DemoDataConfig, ScaleDataConfig, WorldConfig
from fid.config.loading import (
    ConfigError,
    check_finite,
    check_range,
    check_unique_keys,
    config_from_dict,
    config_to_dict,
    load_config,
    load_yaml,
)
from fid.config.reader import (
    SCORE_MODES,
    EvalReaderConfig,
    GenerationConfig,
    InitReaderConfig,
    ReaderInputConfig,
    ReaderTrainConfig,
    ScorePassagesConfig,
)
from fid.config.retrieval import (
    EmbedPassagesConfig,
    EvalRetrievalConfig,
    IndexConfig,
    RetrieveConfig,
)
from fid.config.retriever import InitRetrieverConfig, RetrieverTrainConfig, reader_temperature_for
from fid.config.training import TrainingConfig

__all__ = [
    "SCORE_MODES",
    "BM25Config",
    "ConfigError",
    "DemoDataConfig",
    "DownloadConfig",
    "EmbedPassagesConfig",
    "EvalReaderConfig",
    "EvalRetrievalConfig",
    "GenerationConfig",
    "IndexConfig",
    "InitReaderConfig",
    "InitRetrieverConfig",
    "PrepareQuestionsConfig",
    "ReaderInputConfig",
    "ReaderListsConfig",
    "ReaderTrainConfig",
    "RetrieveConfig",
    "RetrieverTrainConfig",
    "ScaleDataConfig",
    "ScorePassagesConfig",
    "TrainingConfig",
    "WorldConfig",
    "reader_temperature_for",
    "check_finite",
    "check_range",
    "check_unique_keys",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "load_yaml",
]
