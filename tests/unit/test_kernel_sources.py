"""``read_source``: kernel files include shared ``.cl`` text, expanded before any compiler sees it."""

from __future__ import annotations

import sys
from importlib import resources

import pytest

from tunecl.kernels.base import KERNEL_FOLDERS, kernel_folders, read_source

GEMM_KERNELS = ("gemm_tiled.cl", "gemm_mma.cl", "gemm_simt.cl", "gemm_wgmma.cl")


def _kernel_files() -> dict[str, str]:
    """Every ``.cl`` file of the kernel folders: name -> the package of its folder."""
    found: dict[str, str] = {}
    for folder in KERNEL_FOLDERS:
        package = "tunecl.kernels" + (f".{folder}" if folder else "")
        for path in resources.files(package).iterdir():
            if path.name.endswith(".cl"):
                found.setdefault(path.name, package)
    return found


KERNEL_FILES = _kernel_files()


@pytest.mark.parametrize("name", sorted(KERNEL_FILES))
def test_every_kernel_file_expands_to_text_without_includes(name):
    text = read_source(KERNEL_FILES[name], name)
    assert not any(line.lstrip().startswith("#include") for line in text.splitlines())


def test_kernel_file_names_are_unique_across_the_kernel_folders():
    """Includes name a file alone, so one name must mean one file whichever folder searches first."""
    names = [path.name for folder in kernel_folders() for path in folder.iterdir() if path.name.endswith(".cl")]
    assert sorted(names) == sorted(set(names))
    assert len(kernel_folders()) == len(KERNEL_FOLDERS)


def test_a_kernel_includes_the_files_of_the_gemm_core_by_name():
    """``conv_implicit_gemm_mma.cl`` (conv/) includes ``mma_core.cl`` (gemm/): found in the GEMM core's
    folder and expanded there, with its own includes searched from its folder."""
    assert "mma_core.cl" not in [p.name for p in resources.files("tunecl.kernels.conv").iterdir()]
    text = read_source("tunecl.kernels.conv", "conv_implicit_gemm_mma.cl")
    core = read_source("tunecl.kernels.gemm", "mma_core.cl")
    assert f"// ---- mma_core.cl ----\n{core}\n// ---- end of mma_core.cl ----" in text


@pytest.mark.parametrize("name", GEMM_KERNELS)
def test_the_gemm_kernels_share_the_tile_order_once(name):
    text = read_source("tunecl.kernels.gemm", name)
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

