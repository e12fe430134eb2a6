"""Host→device copies (``x.to("opencl")`` of a contiguous CPU float32 tensor) by each of the backend's routes.

An eager or compiled training step copies its batch to the device first (``tunecl bench`` does, as the
seed table did): 9.6 MB at batch 16, image 224. The backend has three routes for such an upload
(:mod:`tunecl.backend.copies`):

- ``staged``: a fresh buffer created with ``COPY_HOST_PTR`` (the driver copies the pageable bytes before
  returning), then an enqueued device copy;
- ``pinned``: a few threads copy the bytes into a page-locked buffer (``ALLOC_HOST_PTR``, mapped once) in
  chunks (of ``STAGING_CHUNK`` bytes; ``pinned-K``: of K MiB), each written by a non-blocking
  ``clEnqueueWriteBuffer`` as soon as it is staged;
- ``blocking``: one blocking ``clEnqueueWriteBuffer`` from the pageable bytes;

and ``default``, the route the backend picks for that size on this device. For each size it prints the
median host time until ``to`` returned and until the device finished (``synchronize``), in µs, with the
spread; on a machine with CUDA, torch CUDA's ``x.to("cuda")`` from pageable memory next to them in the same
run, and the ratio of each route's time-to-done to it. The routes take turns, one copy each per round, so a
disturbance of the machine hits them alike; the peer's copies come first, on their own.

    python benchmarks/upload.py
    TUNECL_DEVICE=nvidia python benchmarks/upload.py --repeats 50 --routes default,staged,pinned,pinned-1,blocking
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import torch

SIZES = {"64 KiB": 1 << 14, "1 MiB": 1 << 18, "4 MiB": 1 << 20, "batch 16x3x224x224": 16 * 3 * 224 * 224,
         "batch 64x3x224x224": 64 * 3 * 224 * 224}


@contextlib.contextmanager
def route(name: str):
    """The backend's copies made by route ``name`` while the block runs."""
    from tunecl.backend import copies

    saved = copies.STAGING_LIMIT, copies.PINNED_LIMIT, copies.PINNED_UPLOADS, copies.STAGING_CHUNK
    if name == "staged":
        copies.STAGING_LIMIT, copies.PINNED_UPLOADS = 1 << 40, False
    elif name.startswith("pinned"):   # pinned, or pinned-K: in chunks of K MiB
        copies.PINNED_LIMIT, copies.PINNED_UPLOADS = 0, True
        if "-" in name:
            copies.STAGING_CHUNK = int(name.split("-")[1]) << 20
    elif name == "blocking":
        copies.STAGING_LIMIT, copies.PINNED_UPLOADS = 0, False
    try:
        yield
    finally:
        copies.STAGING_LIMIT, copies.PINNED_LIMIT, copies.PINNED_UPLOADS, copies.STAGING_CHUNK = saved


def time_copy(x: torch.Tensor, device: str, sync) -> tuple[float, float]:
    """Host seconds until ``x.to(device)`` returned and until ``sync()`` did."""
    sync()
    start = time.perf_counter()
    y = x.to(device)
    mid = time.perf_counter()
    sync()
    end = time.perf_counter()
    del y
    return mid - start, end - start


def _cell(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1e6:9.0f} [{min(seconds) * 1e6:.0f}-{max(seconds) * 1e6:.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--routes", default="default,staged,pinned,blocking")
    args = parser.parse_args()
    import tunecl.backend  # noqa: F401  (registers the opencl device)

    cuda = torch.cuda.is_available()
    print(f"opencl:0 {torch.opencl.get_device_name(0)}" + (f"; peer torch {torch.__version__} {torch.cuda.get_device_name(0)}"
                                                          if cuda else "; no CUDA peer on this machine"))
    print("µs per copy, median [min-max] of", args.repeats, "; 'returned': until x.to() returned, 'done': until the device finished")
    routes = args.routes.split(",")
    for label, count in SIZES.items():
        x = torch.randn(count)
        print(f"\n{label} float32 ({x.numel() * 4 / 1e6:.2f} MB)")
        # the peer's copies first, then the routes taking turns, a copy each, every series after 3 untimed
        # rounds (staging buffers, pools): a copy right after the other driver's pays for the GPU's switch
        # between the two contexts (on an H100, 64 KiB took 214 µs so against 69)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in ["torch CUDA"] * cuda + routes}
        if cuda:
            samples["torch CUDA"] = [time_copy(x, "cuda", torch.cuda.synchronize)
                                     for _ in range(args.repeats + 3)][3:]
        for round_ in range(args.repeats + 4):
            for name in routes:
                with route(name):
                    sample = time_copy(x, "opencl", torch.opencl.synchronize)
                if round_ >= 4:
                    samples[name].append(sample)
        peer = statistics.median(done for _, done in samples["torch CUDA"]) if cuda else None
        for name, pairs in samples.items():
            returned, done = [r for r, _ in pairs], [d for _, d in pairs]
            ratio = f"  ratio {statistics.median(done) / peer:.2f}" if peer and name != "torch CUDA" else ""
            print(f"  {name:10s} returned {_cell(returned)}  done {_cell(done)}{ratio}")

if __name__ == "__main__":
    main()
