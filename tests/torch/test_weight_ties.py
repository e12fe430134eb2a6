"""Weight ties survive every way a model is moved or rebuilt: one ``Parameter`` object and one storage
afterwards, as on CUDA, and gradients that add up in it (tied input/output embeddings)."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn


class TiedLM(nn.Module):
    """An embedding whose weight is also the output projection's (GPT-2, BERT, T5 tie them so)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.mix = nn.Linear(6, 6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


def _assert_tied(model: TiedLM, device: str, dtype: torch.dtype = torch.float32) -> None:
    assert model.head.weight is model.embed.weight
    assert len(list(model.parameters())) == 3
    weight = model.embed.weight
    assert weight.device.type == device and weight.dtype == dtype
    assert isinstance(weight, nn.Parameter) and weight.requires_grad


MOVES = {
    "to": lambda m: m.to("opencl"),
    "opencl()": lambda m: m.opencl(),
    "to(device, dtype)": lambda m: m.to("opencl", torch.float16),
    "to(device=, dtype=)": lambda m: m.to(device=torch.device("opencl:0"), dtype=torch.float16),
}


@pytest.mark.parametrize("move", sorted(MOVES))
def test_a_move_to_the_device_keeps_the_parameter_object(move):
    model = TiedLM()
    weight = model.embed.weight
    MOVES[move](model)
    _assert_tied(model, "opencl", torch.float16 if "dtype" in move else torch.float32)
    assert model.embed.weight is weight   # the same object, as param.data = ... keeps it on CUDA


def test_conversions_on_the_device_and_back_keep_the_tie():
    model = TiedLM().to("opencl")
    weight = model.embed.weight
    model.half()
    _assert_tied(model, "opencl", torch.float16)
    model.float()
    _assert_tied(model, "opencl")
    model.cpu()
    _assert_tied(model, "cpu")
    assert model.embed.weight is weight


def test_a_parameter_with_a_gradient_moves_with_it():
    model = TiedLM()
    model(torch.tensor([1, 2])).sum().backward()
    expected = model.embed.weight.grad.clone()
    model.to("opencl")
    _assert_tied(model, "opencl")
    assert model.embed.weight.grad.device.type == "opencl"
    torch.testing.assert_close(model.embed.weight.grad.cpu(), expected)


def test_a_model_whose_graph_is_still_alive_moves_tied():
    """A live autograd graph references the parameters, so torch refuses to swap them; the move then
    goes the ordinary way and the slots are tied again."""
    model = TiedLM()
    out = model(torch.tensor([3, 4]))   # keeps its graph (and so the parameters) referenced
    model.to("opencl")
    _assert_tied(model, "opencl")
    del out


def test_deepcopy_save_load_and_load_state_dict_keep_the_tie():
    model = TiedLM().to("opencl")
    _assert_tied(copy.deepcopy(model), "opencl")
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    _assert_tied(torch.load(buffer, weights_only=False), "opencl")
    other = TiedLM().to("opencl")
    other.load_state_dict(model.state_dict())
    _assert_tied(other, "opencl")
    torch.testing.assert_close(other.embed.weight.cpu(), model.embed.weight.cpu(), rtol=0, atol=0)


def test_tied_gradients_add_up_and_one_step_updates_both_uses():
    torch.manual_seed(0)
    reference = TiedLM().double()
    model = copy.deepcopy(reference).float().to("opencl")
    tokens = torch.tensor([[1, 5, 7], [2, 2, 10]])
    reference(tokens).square().sum().backward()
    model(tokens.to("opencl")).square().sum().backward()
    grad = model.embed.weight.grad.cpu().double()
    torch.testing.assert_close(grad, reference.embed.weight.grad, rtol=1e-5, atol=1e-5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.step()
    assert model.head.weight is model.embed.weight
    expected = reference.embed.weight - 0.1 * reference.embed.weight.grad
    torch.testing.assert_close(model.head.weight.detach().cpu().double(), expected, rtol=1e-5, atol=1e-5)


def test_swap_mode_set_by_the_user_is_left_alone():
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model = TiedLM().to("opencl")
        _assert_tied(model, "opencl")
        assert torch.__future__.get_swap_module_params_on_conversion()
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert not torch.__future__.get_swap_module_params_on_conversion()
