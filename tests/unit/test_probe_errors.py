"""What a capability probe reports when its kernel does not build."""

from __future__ import annotations

from tunecl.runtime.build import compile_error


def test_a_failed_probe_build_names_the_assembler_errors_not_only_its_summary():
    log = ("clBuildProgram failed: BUILD_PROGRAM_FAILURE\nBuild on <device>:\n"
           "ptxas /tmp/x.ptx, line 212; error   : Instruction 'wgmma.fence' requires .target sm_90a\n"
           "ptxas /tmp/x.ptx, line 230; error   : Arguments mismatch for instruction 'wgmma.mma_async'\n"
           "ptxas fatal   : Ptx assembly aborted due to errors\n")
    text = compile_error(RuntimeError(log))
    assert "wgmma.fence' requires .target sm_90a" in text and "Arguments mismatch" in text
    assert "aborted" not in text
    assert compile_error(RuntimeError("ptxas fatal   : Ptx assembly aborted due to errors")).startswith("ptxas fatal")
    assert compile_error(RuntimeError("something else went wrong\nmore")) == "something else went wrong"
