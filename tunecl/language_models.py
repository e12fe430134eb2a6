"""Language models the tools build by name (``hf:bert``, ``hf:gpt2``): Hugging Face ``transformers``
architectures from small configs, with random weights (nothing is downloaded).

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

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tunecl.errors import TuneclError

PREFIX = "hf:"
VOCAB = 1000
LABELS = 3
MAX_LENGTH = 512
# hidden 64 in 4 heads of 16, 2 layers: a training step of either takes seconds on a 2-core CPU
HIDDEN, LAYERS, HEADS, INTERMEDIATE = 64, 2, 4, 256


class TokenModel(nn.Module):
    """A language model as the tools run it: token ids in, ``rows x classes`` logits out."""

    vocab_size = VOCAB

    def example_batch(self, batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Random token ids ``batch x length`` and the labels the model's loss compares with."""
        raise NotImplementedError


class SequenceClassifier(TokenModel):
    """``BertForSequenceClassification``: the logits of each sequence's ``[CLS]`` token."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.labels = model.config.num_labels

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits

    def example_batch(self, batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        _check_length(length)
        ids = torch.randint(0, self.vocab_size, (batch, length), generator=generator)
        return ids, torch.randint(0, self.labels, (batch,), generator=generator)


class NextTokenModel(TokenModel):
    """``GPT2LMHeadModel``: the logits that predict tokens ``1 .. length - 1``, flattened."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids).logits
        return logits[:, :-1].reshape(-1, logits.shape[-1])

    def example_batch(self, batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        _check_length(length)
        if length < 2:
            raise TuneclError("a next-token model needs sequences of at least 2 tokens")
        ids = torch.randint(0, self.vocab_size, (batch, length), generator=generator)
        return ids, ids[:, 1:].reshape(-1)


def _check_length(length: int) -> None:
    if length > MAX_LENGTH:
        raise TuneclError(f"sequence length {length} exceeds the models' {MAX_LENGTH} positions")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise TuneclError("hf: models need the transformers package (pip install 'tunecl[test]' or "
                          "pip install transformers)") from None
    return transformers


def bert() -> SequenceClassifier:
    """BERT for sequence classification (3 labels) from a small config."""
    hf = _transformers()
    config = hf.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, intermediate_size=INTERMEDIATE,
                           max_position_embeddings=MAX_LENGTH, num_labels=LABELS,
                           attention_probs_dropout_prob=0.0)
    return SequenceClassifier(hf.BertForSequenceClassification(config))


def gpt2() -> NextTokenModel:
    """GPT-2 with its LM head from a small config."""
    hf = _transformers()
    config = hf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=INTERMEDIATE,
                           n_positions=MAX_LENGTH, attn_pdrop=0.0, bos_token_id=VOCAB - 1,
                           eos_token_id=VOCAB - 1)
    return NextTokenModel(hf.GPT2LMHeadModel(config))


MODELS: dict[str, Callable[[], TokenModel]] = {f"{PREFIX}bert": bert, f"{PREFIX}gpt2": gpt2}


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
