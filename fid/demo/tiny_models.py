"""Models built on the spot when no pretrained one can be downloaded (demo, tests).

A BPE tokenizer trained on the corpus at hand with the `tokenizers` library (well under a second
for a few thousand passages) and a randomly initialised T5 of a chosen size. Real runs start from
a pretrained T5 (`t5-base`, `t5-large`, a local folder) instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (
    BertConfig,
    BertModel,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)

from fid.config import InitReaderConfig, InitRetrieverConfig
from fid.demo.corpus import corpus_texts
from fid.runtime.fileio import atomic_directory

logger = logging.getLogger(__name__)

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A lowercasing BPE tokenizer with T5's special tokens (pad 0, EOS 1, unk 2).

    Words are split on whitespace (Metaspace, so decoding restores spaces), punctuation and
    single digits: numbers then share pieces, which a tiny model learns far more easily than
    one-off year tokens.
    """
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(),
            pre_tokenizers.Punctuation(),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[PAD, EOS, UNK], show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.post_processor = t5_post_processor(tokenizer.token_to_id(EOS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, unk_token=UNK
    )


def t5_post_processor(eos_id: int) -> processors.TemplateProcessing:
    """What the hub's T5 tokenizers (t5-base's tokenizer.json) add to every text: `</s>`.
    fid's reader asks for no special tokens where the original added none (passages) and adds
    the EOS of labels itself; a tokenizer built here behaves as the real ones do, so that a
    call that forgot this is seen."""
    return processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, eos_id)]
    )


def build_tiny_t5(config: InitReaderConfig, vocab_size: int) -> T5ForConditionalGeneration:
    """A randomly initialised T5 (seeded) for a tokenizer with `vocab_size` ids."""
    import torch

    t5_config = T5Config(
        vocab_size=vocab_size,
        d_model=config.d_model,
        d_ff=config.d_ff,
        d_kv=config.d_kv,
        num_layers=config.num_layers,
        num_decoder_layers=config.num_decoder_layers,
        num_heads=config.num_heads,
        dropout_rate=config.dropout_rate,
        relative_attention_num_buckets=config.relative_attention_num_buckets,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    torch.manual_seed(config.seed)
    return T5ForConditionalGeneration(t5_config)


BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_bert_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """An uncased subword tokenizer in BERT's layout: `[CLS] A [SEP]` and
    `[CLS] A [SEP] B [SEP]` with token type ids, [PAD] = 0.

    The vocabulary is learnt with plain BPE: the `tokenizers` WordPiece trainer (and BPE with a
    `##` continuation prefix) break ties differently from run to run (tokenizers 0.23), and a
    tokenizer must come out the same every time the pipeline is rebuilt. Retrieval never
    decodes, so pieces need no continuation marks.
    """
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.BertPreTokenizer(), pre_tokenizers.Digits(individual_digits=True)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=BERT_SPECIALS, show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def build_tiny_bert(config: InitRetrieverConfig, vocab_size: int) -> BertModel:
    """A randomly initialised BERT encoder (seeded) for a tokenizer with `vocab_size` ids."""
    import torch

    bert_config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        hidden_dropout_prob=config.dropout,
        attention_probs_dropout_prob=config.dropout,
        pad_token_id=0,
    )
    torch.manual_seed(config.seed)
    return BertModel(bert_config, add_pooling_layer=False)


def _init_model(
    cfg, corpus: Sequence[Path], output: Path, train: Callable, build: Callable, what: str
) -> None:
    texts = list(corpus_texts(corpus))
    tokenizer = train(texts, cfg.vocab_size)
    model = build(cfg, vocab_size=len(tokenizer))
    with atomic_directory(output) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "wrote a random %s (%.2fM parameters) and a %d-piece tokenizer trained on %d texts to %s",
        what, n_params / 1e6, len(tokenizer), len(texts), output,
    )  # fmt: skip


def init_reader(cfg: InitReaderConfig, corpus: Sequence[Path], output: Path) -> None:
    """`fid init-reader`: a tokenizer trained on the corpus and a random T5, in one folder."""
    _init_model(cfg, corpus, output, train_tokenizer, build_tiny_t5, "T5")


def init_retriever(cfg: InitRetrieverConfig, corpus: Sequence[Path], output: Path) -> None:
    """`fid init-retriever`: a BERT-layout tokenizer trained on the corpus and a random BERT
    encoder, in one folder (a plain Hugging Face encoder, which training wraps)."""
    _init_model(cfg, corpus, output, train_bert_tokenizer, build_tiny_bert, "BERT encoder")
