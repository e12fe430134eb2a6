"""Language models the tools build by name (``hf:bert``, ``hf:gpt2``, ``hf:bert-base``, ``hf:gpt2-base``):
Hugging Face ``transformers`` architectures with random weights (nothing is downloaded). ``hf:bert`` and
``hf:gpt2`` are small configs (hidden 64, 2 layers: a training step takes seconds on a 2-core CPU) for
tests and validation; the ``-base`` names have the published base models' sizes (hidden 768 in 12 heads,
12 layers, feed-forward 3072, their vocabularies and position counts) for benchmarks.

Each is wrapped so that the tools treat it as they treat an image classifier: the model takes one
tensor, here token ids of shape ``batch x length`` (int64), and returns ``rows x classes`` logits whose
cross-entropy against the labels is the model's training loss:

- ``hf:bert``: ``BertForSequenceClassification``; one label per sequence (``batch x labels`` logits).
- ``hf:gpt2``: ``GPT2LMHeadModel`` (LM head tied to the token embedding); the labels are the next
  tokens, so the logits of every position but the last come back as ``batch * (length - 1) x vocab``.

A model that takes other inputs than images says so with :meth:`TokenModel.example_batch`; any model
with that method (a ``package.module:factory`` one too) gets its inputs and labels from it.

Attention dropout is off in both configs: CPU torch runs ``scaled_dot_product_attention`` through its
own fused kernel, which draws its dropout mask differently from the math form the device runs, so the
two could not be compared. Hidden-state dropout (``nn.Dropout``) stays at the models' default 0.1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tunecl.errors import TuneclError

PREFIX = "hf:"
LABELS = 3


@dataclass(frozen=True)
class Size:
    """A transformer's dimensions: ``hidden`` split into ``heads``, ``layers`` blocks whose feed-forward
    layer is ``intermediate`` wide, ``vocab`` tokens, sequences up to ``positions`` tokens."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    positions: int


SMALL = Size(hidden=64, layers=2, heads=4, intermediate=256, vocab=1000, positions=512)
BERT_BASE = Size(hidden=768, layers=12, heads=12, intermediate=3072, vocab=30522, positions=512)
GPT2_BASE = Size(hidden=768, layers=12, heads=12, intermediate=3072, vocab=50257, positions=1024)


class TokenModel(nn.Module):
    """A language model as the tools run it: token ids in, ``rows x classes`` logits out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.max_length = model.config.max_position_embeddings

    def example_batch(self, batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Random token ids ``batch x length`` and the labels the model's loss compares with."""
        raise NotImplementedError

    def _check_length(self, length: int) -> None:
        if length > self.max_length:
            raise TuneclError(f"sequence length {length} exceeds the model's {self.max_length} positions")


class SequenceClassifier(TokenModel):
    """``BertForSequenceClassification``: the logits of each sequence's ``[CLS]`` token."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.labels = model.config.num_labels

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits

    def example_batch(self, batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_length(length)
        ids = torch.randint(0, self.vocab_size, (batch, length), generator=generator)
        return ids, torch.randint(0, self.labels, (batch,), generator=generator)


class NextTokenModel(TokenModel):
    """``GPT2LMHeadModel``: the logits that predict tokens ``1 .. length - 1``, flattened."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids).logits
        return logits[:, :-1].reshape(-1, logits.shape[-1])

    def example_batch(self, batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_length(length)
        if length < 2:
            raise TuneclError("a next-token model needs sequences of at least 2 tokens")
        ids = torch.randint(0, self.vocab_size, (batch, length), generator=generator)
        return ids, ids[:, 1:].reshape(-1)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise TuneclError("hf: models need the transformers package (pip install 'tunecl[test]' or "
                          "pip install transformers)") from None
    return transformers


def bert(size: Size = SMALL) -> SequenceClassifier:
    """BERT for sequence classification (3 labels) of the given size."""
    hf = _transformers()
    config = hf.BertConfig(vocab_size=size.vocab, hidden_size=size.hidden, num_hidden_layers=size.layers,
                           num_attention_heads=size.heads, intermediate_size=size.intermediate,
                           max_position_embeddings=size.positions, num_labels=LABELS,
                           attention_probs_dropout_prob=0.0)
    return SequenceClassifier(hf.BertForSequenceClassification(config))


def gpt2(size: Size = SMALL) -> NextTokenModel:
    """GPT-2 with its LM head (tied to the token embedding) of the given size."""
    hf = _transformers()
    config = hf.GPT2Config(vocab_size=size.vocab, n_embd=size.hidden, n_layer=size.layers, n_head=size.heads,
                           n_inner=size.intermediate, n_positions=size.positions, attn_pdrop=0.0,
                           bos_token_id=size.vocab - 1, eos_token_id=size.vocab - 1)
    return NextTokenModel(hf.GPT2LMHeadModel(config))


MODELS: dict[str, Callable[[], TokenModel]] = {
    f"{PREFIX}bert": bert,
    f"{PREFIX}gpt2": gpt2,
    f"{PREFIX}bert-base": functools.partial(bert, BERT_BASE),
    f"{PREFIX}gpt2-base": functools.partial(gpt2, GPT2_BASE),
}


def builder(name: str) -> Callable[[], TokenModel]:
    """What builds the model ``name`` (one of :data:`MODELS`), checked without building it.

    Raises:
        ValueError: an unknown ``hf:`` name (the message lists the known ones).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; the hf: models are {', '.join(MODELS)}")
    return MODELS[name]


def build(name: str) -> TokenModel:
    """The model ``name`` (one of :data:`MODELS`) with random weights (:func:`builder`'s errors)."""
    return builder(name)()
