"""The backend State's seams (:mod:`tunecl.backend.state`): what a dry run installs instead of patching."""

from __future__ import annotations

import pytest
import torch

import tunecl.backend  # noqa: F401
from tunecl.backend import copies, fallback, plans, state


def test_the_real_implementations_are_provided_for_every_seam():
    real = state.get()
    assert real.write_bytes is copies.write_bytes and real.read_bytes is copies.read_bytes
    assert real.plan is plans.plan and real.on_fallback is fallback.check_allowed
    for name in state.SEAMS:
        assert callable(getattr(real, name)), name


def test_providing_an_unknown_seam_is_an_error_that_names_the_seams():
    with pytest.raises(ValueError, match="not a seam of the backend State") as error:
        state.provide(launch=lambda: None)
    assert all(name in str(error.value) for name in state.SEAMS)


def test_an_installed_state_serves_the_block_and_the_real_one_comes_back():
    real = state.get()
    seen = []
    other = state.State(real.device)
    other.write_bytes = lambda buffer, offset, data: seen.append(data.nbytes)   # records, moves nothing
    with state.installed(other) as installed:
        assert installed is other and state.get() is other
        state.get().write_bytes(None, 0, torch.zeros(3).numpy())
    assert state.get() is real and seen == [12]
    x = torch.arange(4.0).to("opencl")   # the real device works again afterwards
    assert torch.equal(x.cpu(), torch.arange(4.0))
