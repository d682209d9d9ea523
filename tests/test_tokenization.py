"""The reader's tokens as the original's, with tokenizers as the hub ships them.

Hub T5 tokenizers append `</s>` to every text they encode (a post-processor) and decode with a
clean-up default that differs across models and versions; the original FiD (transformers
3.0.2) added no EOS to passages, one to labels, and decoded with the clean-up on. The golden
fixtures' word-level vocabulary is rebuilt here as a fast tokenizer carrying T5's
post-processor, so that a collator that forgot `add_special_tokens=False`, or a decode that
trusted the tokenizer's default, gives other ids or answers than the original's. A T5 folder
whose only tokenizer file is `spiece.model` (sentencepiece, a dependency) loads and reads as
T5's does.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from fid.data.examples import Example
from fid.data.reader_batches import ReaderCollator
from fid.demo.tiny_models import t5_post_processor
from fid.inference.generation import decode_answers

GOLDEN = Path(__file__).parent / "golden" / "reader"


def _json(path: Path):
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def hub_like_tokenizer() -> PreTrainedTokenizerFast:
    """The fixtures' tokenizer (generate.py's WordT5Tokenizer: lower-case, `\\w+|[^\\w\\s]`,
    unknown words -> <unk>) as a fast tokenizer with the post-processor of t5-base's."""
    vocab = _json(GOLDEN / "inputs.json")["vocab"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(),
         pre_tokenizers.Split(Regex(r"\w+|[^\w\s]"), behavior="isolated")]
    )  # fmt: skip
    tokenizer.post_processor = t5_post_processor(vocab.index("</s>"))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    assert fast("cairo").input_ids[-1] == fast.eos_token_id  # as t5-base's: EOS appended
    return fast


@pytest.mark.parametrize("case", list(_json(GOLDEN / "inputs.json")["cases"]))
def test_reader_batches_give_the_originals_ids(hub_like_tokenizer, case):
    """Every passage's ids as the original's (no EOS: passages padded right after the last
    word), and each label with exactly one EOS, cut and padded as with answer_maxlength."""
    options = _json(GOLDEN / "expected.json")["options_used_here"]
    data = _json(GOLDEN / "inputs.json")["cases"][case]
    examples = [Example(str(i), r["question"], r["answers"], r.get("target"), r["ctxs"], r)
                for i, r in enumerate(data["examples"])]  # fmt: skip
    collator = ReaderCollator(
        hub_like_tokenizer, data["n_passages"], options["text_maxlength"],
        target_max_tokens=options["answer_maxlength"], pad_to_max_length=True,
    )  # fmt: skip
    batch = collator(examples, [r["target"] for r in data["examples"]])
    assert batch.input_ids.tolist() == data["input_ids"]
    assert batch.attention_mask.tolist() == [[[int(v) for v in row] for row in rows]
                                             for rows in data["attention_mask"]]  # fmt: skip
    assert batch.labels.tolist() == data["labels"]
    eos = hub_like_tokenizer.eos_token_id
    assert all(row.count(eos) == 1 for row in batch.labels.tolist())
    assert not (batch.input_ids == eos).any()


def test_answers_decode_as_the_originals(hub_like_tokenizer):
    """The original's greedy ids decode to its answers ("cairo, illinois", not "cairo ,
    illinois"): the clean-up is set, not left to the tokenizer's default."""
    for case in _json(GOLDEN / "expected.json")["cases"].values():
        ids = torch.tensor(case["greedy_ids"])
        assert decode_answers(hub_like_tokenizer, ids) == case["greedy_text"]


def test_a_t5_folder_with_only_spiece_model(tmp_path, tiny_model_dir):
    """A T5 folder whose tokenizer is spiece.model (released checkpoints; sentencepiece is a
    dependency) loads, appends EOS as T5's tokenizer does, and the collator gives passages the
    sentencepiece ids without it and labels with one EOS."""
    import sentencepiece
    from transformers import AutoTokenizer

    from fid.models.folder_checks import check_reader

    texts = [line.split("\t")[1] for line in (Path(__file__).parents[1] / "samples" /
             "squad-open-tiny" / "psgs_w100.tsv").read_text().splitlines()[1:]]  # fmt: skip
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=300, pad_id=0, eos_id=1,
        unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        minloglevel=2, num_threads=1,
    )  # fmt: skip
    folder = tmp_path / "t5"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((tiny_model_dir / name).read_bytes())
    (folder / "spiece.model").write_bytes(model.getvalue())
    check_reader(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    text = "question: who? title: Cairo context: the river meets"
    assert tokenizer(text).input_ids == processor.encode(text) + [1]  # T5 appends EOS
    example = Example("q", "who?", ["Cairo"], None, [{"title": "Cairo", "text": "the river meets"}],
                      {})  # fmt: skip
    batch = ReaderCollator(tokenizer, 1, 64)([example], ["Cairo"])
    assert batch.input_ids[0, 0].tolist() == processor.encode(text)
    assert batch.labels[0].tolist() == processor.encode("Cairo") + [1]
