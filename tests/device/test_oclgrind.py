"""Memory safety of tunecl's kernels: every family and the backend's kernels run on the Oclgrind simulator.

On PoCL a device buffer is host memory, so a kernel that writes out of bounds corrupts the Python heap
and the process crashes much later in unrelated code. Oclgrind (``apt-get install oclgrind``), an OpenCL
device simulator, checks every access as it runs a kernel: reads and writes outside a buffer or a
local or private array, data races in local and global memory (``OCLGRIND_DATA_RACES``), work-items
of a group that do not all reach a barrier, and API errors (``OCLGRIND_CHECK_API``). It prints a
report on stderr for each.

Each test runs one suite of ``oclgrind_child.py`` in a child process on Oclgrind and fails on any report
(shown in the failure with the case it belongs to), on a case that raised or whose result is far outside
its tolerance (a near miss is a warning), and when a family expected to run did not. Families that need
NVIDIA's inline PTX (the tensor-core ones) do not apply there, as on PoCL; gemm_tiled's cp.async staging
runs with plain copies, as PoCL's tests build it. A canary suite runs two kernels with known faults and
must see both reported, so that checks which are silently off cannot pass.

The default tests take about 45 s of CPU time altogether; ``TUNECL_OCLGRIND=full`` also runs the
``oclgrind_full`` tests (more random configs, every transpose pair, more shapes: about 6 minutes of CPU
time, the conv suite most of it), meant for before a kernel change lands::

    TUNECL_OCLGRIND=full python -m pytest -q -n 2 tests/device/test_oclgrind.py

Oclgrind's uninitialized-value check (``OCLGRIND_UNINITIALIZED``) is not used: in Oclgrind 21.10 it
stops with a fatal error on LLVM's ``freeze`` instruction (which the reduction kernel compiles to), it
crashes while building some pointwise kernels, and it reports the whole-vector ``store undef`` that
clang emits before a float4 is written lane by lane as an uninitialized write.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("oclgrind_child.py")
MARK = "@@oclgrind"
FATAL = "OCLGRIND FATAL ERROR"
FULL = os.environ.get("TUNECL_OCLGRIND", "").strip().lower() == "full"
SUITES = ("gemm", "conv", "pointwise", "nn", "optim")
# the families (or op groups) each suite must have run on Oclgrind
EXPECTED = {
    "canary": {"canary"},
    "gemm": {"gemm_tiled", "gemm_direct", "gemm_simt"},
    "conv": {"conv_depthwise", "conv_1x1", "conv_winograd", "conv_winograd_f4", "conv_implicit_gemm",
             "conv_im2col", "conv_direct"},
    "pointwise": {"pointwise", "reduce", "softmax", "random"},
    "nn": {"norm", "pool", "loss", "ctc", "index", "linear", "conv", "attention"},
    "optim": {"optim"},
}
TIMEOUT_S = 3000 if FULL else 600
SHOWN = 6   # distinct reports shown in full in a failure

# Where Debian (and Ubuntu) install Oclgrind's ICD library; TUNECL_OCLGRIND_ICD names another.
ICD_PATHS = ("/usr/lib/oclgrind/liboclgrind-rt-icd.so", "/usr/local/lib/liboclgrind-rt-icd.so",
             "/usr/lib/x86_64-linux-gnu/liboclgrind-rt-icd.so", "/usr/lib64/liboclgrind-rt-icd.so")


def oclgrind_icd() -> str | None:
    """The path of Oclgrind's ICD library, or None where it is not installed."""
    named = os.environ.get("TUNECL_OCLGRIND_ICD")
    candidates = [named] if named else list(ICD_PATHS)
    if not named and shutil.which("oclgrind"):
        prefix = Path(shutil.which("oclgrind")).resolve().parent.parent
        candidates += [str(prefix / "lib" / "oclgrind" / "liboclgrind-rt-icd.so"),
                       str(prefix / "lib" / "liboclgrind-rt-icd.so")]
    return next((path for path in candidates if Path(path).is_file()), None)


needs_oclgrind = pytest.mark.skipif(
    "oclgrind_icd() is None",
    reason="Oclgrind is not installed (no liboclgrind-rt-icd.so in " + ", ".join(ICD_PATHS)
    + "; `apt-get install oclgrind`, or set TUNECL_OCLGRIND_ICD)")
full_only = pytest.mark.skipif(not FULL, reason="the full Oclgrind run: set TUNECL_OCLGRIND=full")


@dataclasses.dataclass(frozen=True)
class Suppression:
    """Reports that are no fault of tunecl's kernels: the report's first line matches ``heading`` and the
    rest of it matches ``body`` (regular expressions, searched)."""

    heading: str
    body: str
    reason: str

    def matches(self, report: Report) -> bool:
        return bool(re.search(self.heading, report.heading) and re.search(self.body, report.body))


SUPPRESSIONS = (
    Suppression(
        r"^Oclgrind - OpenCL runtime error detected$",
        r"Function: clGetDeviceInfo\s+Error:\s+CL_INVALID_VALUE\s+For argument 'param_name'",
        "pyopencl asks every device for properties newer than Oclgrind's OpenCL 1.2 (a plain pyopencl "
        "program build does it) and handles the error itself"),
    Suppression(
        r"^Oclgrind - OpenCL runtime error detected$",
        r"Function: clCreateKernel\s+Error:\s+CL_INVALID_KERNEL_NAME\s+Kernel '_source' not found",
        "pyopencl.Kernel(kernel.program, name) looks up the attribute _source on the program wrapper it "
        "is given; pyopencl.Program.__getattr__ tries any missing attribute as a kernel name, and "
        "pyopencl catches the error (plain pyopencl does the same)"),
    Suppression(
        r"^Index \(\d+\) exceeds static array size \(\d+\)$",
        r"Kernel: conv_implicit_gemm\n(.*\n)*"
        r"\s+for \(int [ij] = 0; [ij] < [AB]_(ROWS|COLS); [ij]\+\+\) \{ [ab]_flm\[",
        "a_flm and b_flm are float views of the whole local tiles a_alm[KWG][A_LD] and b_alm[KWG][B_LD]; "
        "with VWM or VWN 1 clang indexes the 2-D array through its first row, and Oclgrind compares "
        "the index with the row's length instead of the array's (the access is inside the tile)"),
    Suppression(
        r"^(Read-write|Write-read) data race at global memory address",
        r"(?s)\A\s*Kernel: (conv_implicit_gemm\n(?=.*split_part\(ws_agm, s \* OUT_SIZE \+ index\))"
        r"(?=.*ws_agm\[split \* OUT_SIZE \+ index\] = acc_apm)"
        r"|conv_depthwise_bwd_weight\n(?=.*split_part\(ws_agm, s \* DW_SIZE \+ index\))"
        r"(?=.*STORE_DW\(index, red_alm\[t\]\[0\]\)))",
        "a split reduction's last work-group reads the parts the tile's other work-groups stored only after "
        "each of them has counted itself with an atomic increment after its stores (split_finish.cl); "
        "Oclgrind does not model that hand-off between work-groups"),
    Suppression(
        r"^(Read-write|Write-read) data race at global memory address",
        r"(?s)\A\s*Kernel: gemm_tiled\n(?=.*(float sum = |sum \+= |float part = |part \+= )split_part\(w, )"
        r"(?=.*\n\s+(crow\[n \+ f\] = r;|\*\(\(__global floatN\*\)\(crow \+ n\)\) = r\.v;))",
        "the same hand-off in gemm_tiled's split K and its sum over the batch (SUM_BATCH): the last "
        "work-group of a C tile reads the slices and matrices the tile's other work-groups stored "
        "(PrivateToGlobalC into the workspace) after their atomic counts"),
)


# Oclgrind failures that leave a case unchecked, not a fault of tunecl's: such a case is named in a
# warning, and its Python error and the failed kernel creation that follows are not counted. (Each
# suite still fails unless every family ran at least one case to the end.)
LIMITATIONS = (
    Suppression(
        rf"^{FATAL}",
        r"Undefined external function: llvm\.experimental\.noalias\.scope\.decl",
        "Oclgrind 21.10 does not implement this LLVM intrinsic, which clang emits where it inlines a "
        "function with restrict pointer arguments"),
)
UNCHECKED_FOLLOW_UP = Suppression(r"^Oclgrind - OpenCL runtime error detected$",
                                  r"Function: clCreateKernel\s+Error:\s+CL_INVALID_KERNEL_NAME", "")


@dataclasses.dataclass(frozen=True)
class Report:
    """One message of Oclgrind's: its first line, its indented lines, and the case that was running."""

    case: str
    heading: str
    body: str

    def signature(self) -> str:
        """The report without addresses, indices and work-item ids (one per fault, not per access)."""
        text = re.sub(r"0x[0-9a-f]+|\d+", "#", f"{self.heading}\n{self.body}")
        return re.sub(r"(Entity|First entity|Second entity|Work-group):.*", "", text)

    def render(self) -> str:
        return f"[{self.case}]\n{self.heading}\n{self.body}".rstrip()


@dataclasses.dataclass
class ChildRun:
    returncode: int
    stderr: str
    reports: list[Report]
    notes: dict[str, list[str]]   # @@oclgrind lines other than case markers, by kind


def parse(stderr: str) -> tuple[list[Report], dict[str, list[str]]]:
    """Split a child's stderr into Oclgrind's reports (each with the case it came in) and the child's
    own ``@@oclgrind`` lines. A report is a line that starts in column 0 with the indented lines after
    it (a fatal error: with the lines up to the next empty one); whatever else a child writes there (a
    Python message) counts as a report too."""
    reports: list[Report] = []
    notes: dict[str, list[str]] = {}
    label, heading, body = "(before the first case)", None, []

    def close() -> None:
        if heading is not None:
            reports.append(Report(label, heading, "\n".join(body).rstrip()))

    for line in stderr.splitlines():
        if line.startswith(MARK + " "):
            close()
            heading, body = None, []
            kind, _, text = line[len(MARK) + 1:].partition(" ")
            if kind == "case":
                label = text
            else:
                notes.setdefault(kind, []).append(text)
        elif line and not line[0].isspace() and not (heading or "").startswith(FATAL):
            close()
            heading, body = line.strip(), []
        elif heading is not None:
            if not line:
                close()
                heading, body = None, []
            else:
                body.append(line)
    close()
    return reports, notes


def unsuppressed(reports: list[Report]) -> list[Report]:
    return [r for r in reports if not any(s.matches(r) for s in SUPPRESSIONS)]


def run_child(suite: str, tmp_path: Path, full: bool) -> ChildRun:
    """Run ``suite`` of oclgrind_child.py on Oclgrind in a fresh process with a private DB and caches."""
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "oclgrind.icd").write_text(oclgrind_icd() + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OCLGRIND_", "TUNECL_"))}
    env.update({
        # pyopencl's wheels bundle an ocl-icd loader that reads OCL_ICD_VENDORS (not OCL_ICD_FILENAMES)
        "OCL_ICD_VENDORS": str(vendors),
        "TUNECL_DEVICE": "oclgrind",
        "TUNECL_DB": str(tmp_path / "tuning.sqlite"),
        "TUNECL_STORAGE": str(tmp_path / "studies.sqlite"),
        "TUNECL_SHIPPED_DB": "",
        "TUNECL_TUNE": "off",
        "TUNECL_FALLBACK": "error",
        # a fresh compile cache: Oclgrind quotes kernel source lines only for programs built from source
        "TUNECL_CACHE_DIR": str(tmp_path / "cache"),
        "OCLGRIND_CHECK_API": "1",
        "OCLGRIND_DATA_RACES": "1",
        "OCLGRIND_NUM_THREADS": "1",   # one simulator thread per pytest worker
        # no cap: suppressed reports count towards it, and a flood of them must not hide a real one
        "OCLGRIND_MAX_ERRORS": str(2**31 - 1),
        "PYTHONUNBUFFERED": "1",
    })
    command = [sys.executable, str(CHILD), suite] + (["--full"] if full else [])
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, errors="replace",
                              timeout=TIMEOUT_S)
        returncode, stderr = done.returncode, done.stderr
    except subprocess.TimeoutExpired as expired:
        returncode = -1
        stderr = (expired.stderr or b"").decode(errors="replace") if isinstance(expired.stderr, bytes) \
            else (expired.stderr or "")
        stderr += f"\n{MARK} error the child ran past {TIMEOUT_S} s and was killed\n"
    reports, notes = parse(stderr)
    return ChildRun(returncode, stderr, reports, notes)


def describe(reports: list[Report]) -> str:
    """The distinct reports (the first of each, in full, up to SHOWN), with how often each came."""
    first: dict[str, Report] = {}
    counts: dict[str, int] = {}
    for report in reports:
        key = report.signature()
        first.setdefault(key, report)
        counts[key] = counts.get(key, 0) + 1
    parts = [f"({counts[key]}x) {report.render()}" for key, report in list(first.items())[:SHOWN]]
    if len(first) > SHOWN:
        parts.append(f"... and {len(first) - SHOWN} more distinct reports")
    return f"Oclgrind reported {len(reports)} problems ({len(first)} distinct):\n\n" + "\n\n".join(parts)


FAR_OFF = 100  # a wrong result this many tolerances off (or NaN) fails; a nearer one is a warning


def far_off(note: str) -> bool:
    """Whether a ``wrong`` note's worst element is more than FAR_OFF tolerances off (or unreadable).

    Near misses are the correctness tests' business (tests/device, tests/torch on PoCL), where they
    show too; what memory faults cause (values read from the wrong place, NaN) is far off."""
    harness = re.search(r"got (\S+), expected (\S+), tolerance (\S+?)$", note)
    torch_message = re.search(r"Greatest absolute difference: (\S+) .*?\(up to (\S+) allowed\)", note)
    try:
        if harness:
            got, expected, tolerance = (float(v) for v in harness.groups())
            return not abs(got - expected) <= FAR_OFF * tolerance
        if torch_message:
            difference, tolerance = (float(v) for v in torch_message.groups())
            return not difference <= FAR_OFF * tolerance
    except ValueError:
        pass
    return True


def check_suite(suite: str, tmp_path: Path, full: bool) -> None:
    run = run_child(suite, tmp_path, full)
    tail = run.stderr[-4000:]
    assert run.returncode == 0 and run.notes.get("done") == [suite], (
        f"the Oclgrind child of suite {suite} exited with {run.returncode}; its stderr ends:\n{tail}")
    assert any("Oclgrind" in d for d in run.notes.get("device", [])), f"not run on Oclgrind: {run.notes}"
    unchecked = {r.case: r for r in run.reports if any(s.matches(r) for s in LIMITATIONS)}
    if unchecked:
        warnings.warn(f"{len(unchecked)} cases of suite {suite} could not run on Oclgrind:\n"
                      + "\n".join(f"{r.render()}" for r in unchecked.values()), stacklevel=1)
    problems = [r for r in unsuppressed(run.reports) if not (r.case in unchecked and any(
        s.matches(r) for s in (*LIMITATIONS, UNCHECKED_FOLLOW_UP)))]
    assert not problems, describe(problems)
    assert "suppressing further errors" not in run.stderr, "Oclgrind stopped reporting (OCLGRIND_MAX_ERRORS)"
    wrong = run.notes.get("wrong", [])
    near = [note for note in wrong if not far_off(note)]
    if near:
        warnings.warn(f"results of suite {suite} just outside their tolerance on Oclgrind:\n"
                      + "\n".join(near), stacklevel=1)
    failed = [note for note in run.notes.get("error", []) + [n for n in wrong if n not in near]
              if not any(note.startswith(f"{case}: ") for case in unchecked)]
    assert not failed, "cases that failed on Oclgrind:\n" + "\n".join(f[:3000] for f in failed)
    ran = set(" ".join(run.notes.get("ran", [])).split())
    assert EXPECTED[suite] <= ran, f"families that did not run: {sorted(EXPECTED[suite] - ran)}"


@needs_oclgrind
def test_oclgrind_reports_the_canary_faults(tmp_path):
    """An out-of-bounds write and a local-memory race are reported (the checks are on), and nothing else."""
    run = run_child("canary", tmp_path, full=False)
    assert run.returncode == 0 and run.notes.get("done") == ["canary"], run.stderr[-4000:]
    found = unsuppressed(run.reports)
    writes = [r for r in found if r.heading.startswith("Invalid write") and "canary_write_past_end" in r.body]
    races = [r for r in found if "data race" in r.heading and "canary_local_race" in r.body]
    got = describe(found) if found else run.stderr[-4000:]
    assert writes and races, f"missing canary reports; got:\n{got}"
    assert all(r.case == "canary write_past_end" for r in writes)
    assert all(r.case == "canary local_race" for r in races)
    assert len(writes) + len(races) == len(found), describe([r for r in found if r not in writes + races])


@needs_oclgrind
@pytest.mark.parametrize("suite", SUITES)
def test_kernels_are_memory_safe_under_oclgrind(suite, tmp_path):
    check_suite(suite, tmp_path, full=False)


@pytest.mark.oclgrind_full
@full_only
@needs_oclgrind
@pytest.mark.parametrize("suite", SUITES)
def test_kernels_are_memory_safe_under_oclgrind_full(suite, tmp_path):
    check_suite(suite, tmp_path, full=True)


# ---- the report parser (no Oclgrind needed) ------------------------------------------------------------

SAMPLE = f"""{MARK} device Oclgrind Simulator [Oclgrind]
{MARK} case gemm_tiled default gemm:13,7,5

Oclgrind - OpenCL runtime error detected
\tFunction: clGetDeviceInfo
\tError:    CL_INVALID_VALUE
\tFor argument 'param_name'

Invalid read of size 16 at global memory address 0x3000000000040
\tKernel: gemm_tiled
\tEntity: Global(3,0,0) Local(3,0,0) Group(0,0,0)
\t  %9 = load <4 x float>, <4 x float> addrspace(1)* %8, align 16
\tAt line 12 (column 3) of input.cl:
\t  a = vload4(0, src + i);

Invalid read of size 16 at global memory address 0x3000000000050
\tKernel: gemm_tiled
\tEntity: Global(4,0,0) Local(4,0,0) Group(0,0,0)
\t  %9 = load <4 x float>, <4 x float> addrspace(1)* %8, align 16
\tAt line 12 (column 3) of input.cl:
\t  a = vload4(0, src + i);
{MARK} case gemm_direct random gemm:1,1,1

OCLGRIND FATAL ERROR (./src/core/WorkItem.cpp:1681)
Undefined external function: llvm.experimental.noalias.scope.decl
When creating kernel 'gemm_direct'

{MARK} case conv_direct default conv:n=1
Traceback (most recent call last):
  File "x.py", line 1
{MARK} wrong conv_direct default: 3 of 20 elements wrong
{MARK} ran gemm_tiled conv_direct
{MARK} done gemm
"""


def test_parse_attributes_reports_to_cases_and_suppresses_only_the_listed_ones():
    reports, notes = parse(SAMPLE)
    assert [(r.case.split()[0], r.heading.split(" at ")[0]) for r in reports] == [
        ("gemm_tiled", "Oclgrind - OpenCL runtime error detected"), ("gemm_tiled", "Invalid read of size 16"),
        ("gemm_tiled", "Invalid read of size 16"),
        ("gemm_direct", "OCLGRIND FATAL ERROR (./src/core/WorkItem.cpp:1681)"),
        ("conv_direct", "Traceback (most recent call last):")]
    assert reports[3].body.splitlines()[-1] == "When creating kernel 'gemm_direct'"
    assert LIMITATIONS[0].matches(reports[3])
    left = [r for r in unsuppressed(reports) if r is not reports[3]]
    assert left == reports[1:3] + reports[4:]
    assert left[0].signature() == left[1].signature() != left[2].signature()
    text = describe(left)
    assert "3 problems (2 distinct)" in text and "(2x) [gemm_tiled default gemm:13,7,5]" in text
    assert "a = vload4(0, src + i);" in text
    assert notes["wrong"] == ["conv_direct default: 3 of 20 elements wrong"] and notes["done"] == ["gemm"]
    assert notes["device"] == ["Oclgrind Simulator [Oclgrind]"]


def test_only_results_far_outside_their_tolerance_fail():
    near = ("w4 random conv: 1 of 100 elements wrong (beta=0); worst at index (0, 1, 3, 3): got -0.664763, "
            "expected -0.664767, tolerance 3.4e-06")
    assert not far_off(near)
    assert far_off(near.replace("got -0.664763", "got nan")) and far_off(near.replace("-0.664763", "0.1"))
    torch_near = ("Mismatched elements: 1 / 6 (16.7%) | Greatest absolute difference: 2.1e-05 at index (1,) "
                  "(up to 1e-05 allowed) | Greatest relative difference: 0.01 at index (1,) "
                  "(up to 0.0001 allowed)")
    assert not far_off(torch_near) and far_off(torch_near.replace("2.1e-05", "0.5"))
    assert far_off("optim adam: The values for attribute 'shape' do not match: (3,) != (4,).")


def test_the_split_finish_suppressions_are_limited_to_the_parts_and_their_reads():
    body = ("\tKernel: conv_implicit_gemm\n\t\n\tFirst entity:  Global(15,0,3) Local(15,0,0) Group(0,0,3)\n"
            "\t  %19 = load volatile float, float addrspace(1)* %arrayidx341, align 4\n"
            "\tAt line 482 (column 48) of input.cl:\n"
            "\t  for (int s = 0; s < SPLIT; s++) { sum += split_part(ws_agm, s * OUT_SIZE + index); }\n\t\n"
            "\tSecond entity: Global(15,0,0) Local(15,0,0) Group(0,0,0)\n"
            "\t  store float %18, float addrspace(1)* %arrayidx265, align 4\n"
            "\tAt line 461 (column 40) of input.cl:\n"
            "\t  ws_agm[split * OUT_SIZE + index] = acc_apm[i][j];")
    heading = "Read-write data race at global memory address 0x32000000000150"
    assert not unsuppressed([Report("c", heading, body)])
    assert unsuppressed([Report("c", heading, body.replace("conv_implicit_gemm", "gemm_tiled"))])
    assert unsuppressed([Report("c", heading, body.replace("split_part(ws_agm", "out_agm[(ws_agm"))])
    assert unsuppressed([Report("c", heading, body.replace("ws_agm[split * OUT_SIZE + index] = acc_apm",
                                                           "out_agm[out_offset + index] = value"))])
    assert unsuppressed([Report("c", heading.replace("global", "local"), body)])
    depthwise = (body.replace("conv_implicit_gemm", "conv_depthwise_bwd_weight").replace("OUT_SIZE", "DW_SIZE")
                 .replace("ws_agm[split * DW_SIZE + index] = acc_apm[i][j];", "STORE_DW(index, red_alm[t][0])"))
    assert not unsuppressed([Report("c", heading, depthwise)])
    assert unsuppressed([Report("c", heading, depthwise.replace("DW_SIZE", "OUT_SIZE"))])
    assert unsuppressed([Report("c", heading, depthwise.replace("conv_depthwise_bwd_weight", "conv_direct"))])
    gemm = ("\tKernel: gemm_tiled\n\t\n\tFirst entity:  Global(6,6,1) Local(6,6,0) Group(0,0,1)\n"
            "\t  %4 = load volatile float, float addrspace(1)* %add.ptr68, align 4\n"
            "\tAt line 882 (column 23) of input.cl:\n\t  float sum = split_part(w, 0);\n\t\n"
            "\tSecond entity: Global(3,1,0) Local(3,1,0) Group(0,0,0)\n"
            "\t  store float %r67.0.1170, float addrspace(1)* %arrayidx84.1172, align 4\n"
            "\tAt line 641 (column 29) of input.cl:\n\t  crow[n + f] = r;")
    assert not unsuppressed([Report("c", heading, gemm)])
    summed = gemm.replace("float sum = split_part(w, 0);", "float part = split_part(w, 0);")
    assert not unsuppressed([Report("c", heading, summed)])
    assert unsuppressed([Report("c", heading, summed.replace("float part = ", "float other = "))])
    vector = gemm.replace("crow[n + f] = r;", "*((__global floatN*)(crow + n)) = r.v;")
    assert not unsuppressed([Report("c", heading, vector)])
    assert unsuppressed([Report("c", heading, gemm.replace("gemm_tiled", "gemm_simt"))])
    assert unsuppressed([Report("c", heading, gemm.replace("split_part(w, 0)", "cgm[0]"))])
    assert unsuppressed([Report("c", heading, gemm.replace("crow[n + f] = r;", "alm[k] = x;"))])


def test_the_static_array_suppression_is_limited_to_the_flat_tile_views():
    body = ("\tKernel: conv_implicit_gemm\n\tEntity: Global(1,0,0) Local(1,0,0) Group(0,0,0)\n"
            "\t  store float %11, float addrspace(3)* %arrayidx91, align 4\n"
            "\tAt line 353 (column 103) of input.cl:\n"
            "\t  for (int i = 0; i < A_ROWS; i++) { a_flm[(a_lane0 + l * A_TK) * A_LD * VWM + a_row0] = x; }")
    assert not unsuppressed([Report("c", "Index (58) exceeds static array size (17)", body)])
    elsewhere = body.replace("conv_implicit_gemm", "gemm_tiled")
    assert unsuppressed([Report("c", "Index (58) exceeds static array size (17)", elsewhere)])
    other_array = body.replace("a_flm[", "a_reg[")
    assert unsuppressed([Report("c", "Index (58) exceeds static array size (17)", other_array)])
