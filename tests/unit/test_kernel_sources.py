"""``read_source``: kernel files include shared ``.cl`` text, expanded before any compiler sees it."""

from __future__ import annotations

import sys
from importlib import resources

import pytest

from tunecl.kernels.base import read_source

GEMM_KERNELS = ("gemm.cl", "gemm_mma.cl", "gemm_simt.cl", "gemm_wgmma.cl")


@pytest.mark.parametrize("name", sorted(p.name for p in resources.files("tunecl.kernels").iterdir()
                                        if p.name.endswith(".cl")))
def test_every_kernel_file_expands_to_text_without_includes(name):
    text = read_source("tunecl.kernels", name)
    assert not any(line.lstrip().startswith("#include") for line in text.splitlines())


@pytest.mark.parametrize("name", GEMM_KERNELS)
def test_the_gemm_kernels_share_the_tile_order_once(name):
    text = read_source("tunecl.kernels", name)
    assert text.count("inline int2 gemm_tile_of_group(void)") == 1
    assert text.count("gemm_tile_of_group();") == 1


def test_includes_expand_once_nest_and_name_a_missing_file(tmp_path, monkeypatch):
    package = tmp_path / "clpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "leaf.cl").write_text("int leaf;\n")
    (package / "mid.cl").write_text('#include "leaf.cl"\nint mid;\n')
    (package / "top.cl").write_text('#include "mid.cl"\n  #  include "leaf.cl"  // again\nint top;\n')
    (package / "broken.cl").write_text('#include "absent.cl"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("clpkg", None)
    text = read_source("clpkg", "top.cl")
    assert text.count("int leaf;") == 1 and text.index("int leaf;") < text.index("int mid;") < text.index("int top;")
    assert "// leaf.cl: included above" in text
    with pytest.raises(FileNotFoundError):
        read_source("clpkg", "broken.cl")

