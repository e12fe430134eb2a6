"""The nets beyond torchvision's CNNs in ``tunecl validate`` and ``bench``: the ``hf:`` language models
(token ids in, logits and labels the cross-entropy compares), vit_* built for the image size, and the
note on an output that is all zeros (vit_*'s zero-initialised head)."""

from __future__ import annotations

import json

import pytest
import torch

from tunecl import config, language_models
from tunecl.cli import main
from tunecl.errors import TuneclError
from tunecl.tools import load_model, make_batch, model_and_inputs
from tunecl.tools.step_checks import check_run
from tunecl.tools.tolerances import Tolerances
from tunecl.tools.validate import validate_net

pytest.importorskip("transformers")


@pytest.mark.parametrize("net", ["hf:bert", "hf:gpt2"])
def test_a_language_model_trains_one_step_on_the_device_as_on_the_cpu(net):
    with config.override(fallback="error"):
        report = validate_net(net, train=True, batch=2, image_size=6)
    assert report.error is None, report.error
    assert not report.fallback_ops
    kinds = {c.kind for c in report.checks}
    assert {"output", "loss", "grad", "param"} <= kinds
    assert report.exit_code == 0, [c for c in report.checks if not c.passed]
    names = {c.name for c in report.checks if c.kind == "grad"}
    assert "model.bert.embeddings.word_embeddings.weight" in names or "model.transformer.wte.weight" in names


def test_the_inputs_are_token_ids_and_the_labels_what_each_loss_compares():
    model, x, y = model_and_inputs("hf:gpt2", batch=3, image_size=5, train=True, seed=4)
    assert x.dtype == torch.int64 and x.shape == (3, 5) and 0 <= x.min() and x.max() < language_models.SMALL.vocab
    assert torch.equal(y, x[:, 1:].reshape(-1))   # the next tokens
    assert model(x).shape == (3 * 4, language_models.SMALL.vocab)
    assert model.model.lm_head.weight is model.model.transformer.wte.weight   # GPT-2's tied head
    model, x, y = model_and_inputs("hf:bert", batch=3, image_size=5, train=False, seed=4)
    assert x.shape == (3, 5) and y.shape == (3,) and y.max() < language_models.LABELS
    assert model(x).shape == (3, language_models.LABELS)
    again = model_and_inputs("hf:bert", batch=3, image_size=5, train=False, seed=4)
    assert torch.equal(again[1], x) and torch.equal(again[2], y)   # seeded


def test_bad_language_model_names_and_lengths_are_clear_errors():
    with pytest.raises(TuneclError, match="the hf: models are hf:bert, hf:gpt2, hf:bert-base, hf:gpt2-base"):
        load_model("hf:llama")
    with pytest.raises(TuneclError, match="exceeds the model's 512 positions"):
        model_and_inputs("hf:bert", batch=2, image_size=513, train=False)
    with pytest.raises(TuneclError, match="at least 2 tokens"):
        model_and_inputs("hf:gpt2", batch=2, image_size=1, train=True)


@pytest.mark.parametrize("net, parameters, max_length", [
    # the published parameter counts: BERT-base 109,482,240 with its pooler (+ a 768 x 3 classifier),
    # GPT-2 124,439,808 (its LM head is the token embedding)
    ("hf:bert-base", 109_482_240 + 768 * 3 + 3, 512),
    ("hf:gpt2-base", 124_439_808, 1024),
])
def test_the_base_models_have_the_published_sizes(net, parameters, max_length):
    with torch.device("meta"):   # (no weights to initialise)
        model = load_model(net)
    assert sum(p.numel() for p in model.parameters()) == parameters
    assert model.max_length == max_length
    ids, _ = model.example_batch(2, max_length, torch.Generator().manual_seed(0))
    assert ids.shape == (2, max_length) and ids.max() < model.vocab_size
    with pytest.raises(TuneclError, match=f"exceeds the model's {max_length} positions"):
        model.example_batch(2, max_length + 1, torch.Generator())


class _WrongRows(language_models.SequenceClassifier):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids)[:1]


def test_a_model_whose_logits_miss_rows_for_its_labels_is_refused():
    with pytest.raises(TuneclError, match=r"expected logits of shape \(2, classes\) for 2 labels, got \(1, 3\)"):
        make_batch(_WrongRows(language_models.bert().model), batch=2, image_size=4)


def test_vision_transformers_are_built_for_the_image_size():
    with torch.device("meta"):   # (no weights to initialise)
        model = load_model("vit_b_16", image_size=32)
        assert model.image_size == 32 and model(torch.empty(2, 3, 32, 32)).shape == (2, 1000)
        assert load_model("vit_b_16").image_size == 224


def test_validate_says_when_the_output_it_compares_is_all_zeros():
    """vit_* zero-initialise their classification head: an eval-mode output check compares zeros."""
    [check] = check_run({"output": torch.zeros(2, 3)}, {"output": torch.zeros(2, 3)}, Tolerances())
    assert check.passed and "all zeros on both sides" in check.note
    [check] = check_run({"output": torch.ones(2, 3)}, {"output": torch.ones(2, 3)}, Tolerances())
    assert check.passed and not check.note


def test_validate_and_bench_take_a_language_model_on_the_command_line(capsys):
    with config.override(fallback="error"):
        assert main(["validate", "--net", "hf:gpt2", "--image-size", "5", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["net"] == "hf:gpt2" and report["passed"] and not report["fallback_ops"]
        assert main(["bench", "--net", "hf:gpt2", "--batch", "2", "--image-size", "5", "--train", "--compare",
                     "none", "--warmup", "0", "--repeats", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "train" and data["ours"]["median_ms"] > 0


def test_gpt2_generates_greedily_as_on_the_cpu_and_samples_on_the_device():
    """``generate``: greedy decoding gives the CPU's tokens; sampling (top-k, top-p: sort, cumsum, scatter,
    ``multinomial``) runs with nothing on the CPU fallback, follows the seed and keeps to the top-k tokens."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=500, n_positions=64,
                                       bos_token_id=0, eos_token_id=1)).eval()
    prompt = torch.randint(2, 500, (2, 6))
    want = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    device_model = model.to("opencl")
    with config.override(fallback="error"):
        got = device_model.generate(prompt.to("opencl"), max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert torch.equal(got.cpu(), want)
        sampled = []
        for _ in range(2):
            torch.manual_seed(7)
            sampled.append(device_model.generate(prompt.to("opencl"), max_new_tokens=8, do_sample=True, top_k=5,
                                                 top_p=0.95, pad_token_id=0).cpu())
    assert torch.equal(sampled[0], sampled[1])
    tokens = sampled[0]
    assert tokens.shape[1] > 6 and torch.equal(tokens[:, :6], prompt)
    # each sampled token is among the likeliest after its prefix by the CPU's logits (the 5 the device kept,
    # give or take near-ties the two order differently), until its row ends (eos, then padding)
    with torch.no_grad():
        model = model.cpu()
        for step in range(6, tokens.shape[1]):
            top = model(tokens[:, :step]).logits[:, -1].topk(8).indices
            for row, token, likeliest in zip(tokens[:, :step].tolist(), tokens[:, step].tolist(), top.tolist()):
                assert 1 in row or token in likeliest
