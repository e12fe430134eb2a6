"""Which thread runs the backward passes of opencl tensors (``TUNECL_BACKWARD_THREAD``), and backward passes
when torch's autograd engine started before the backend was registered.

torch's engine runs an accelerator's backward on a worker thread of its own while the calling thread waits
(``worker``); ``caller`` (and ``auto``, the default) runs it on the calling thread, as torch does for CPU
tensors (``torch.autograd.set_multithreading_enabled(False)`` around the engine's entry). Either way the
same nodes run in the same order on one thread at a time. On an NVIDIA H100 the calling thread made eager
training steps at batch 16 faster (resnet50 42-43 ms instead of 57-62, BERT-base 65 instead of 80,
mobilenet_v2 the same; ``benchmarks/results/backward_thread_h100.txt``); on PoCL both take the same time.

torch's engine gives each accelerator device a worker thread, sized once, at the process's first backward,
by the device counts known then. A backward on the CPU before ``import tunecl.backend`` therefore leaves the
engine with no queue for opencl, and every later opencl backward stops at an internal assert of the engine
(``device_ready_queues_``). The engine then has to run the device's backward on the calling thread, as it
does for CPU tensors (``torch.autograd.set_multithreading_enabled(False)``, a per-thread setting): this
module wraps torch's entry to the engine so that, once such an engine is met, every backward of the process
(on any thread) runs that way. The assert fires while the engine queues the graph's root, before any node
runs, so the failed call is simply made again.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.autograd
from torch.autograd import graph

from tunecl import config

_ENGINE_ASSERT = "device_ready_queues_"
_CUDA_STREAM_ASSERT = "opt_ready_stream && opt_parent_stream"
CUDA_BACKWARD_HINT = ("a backward over CUDA tensors fails inside torch in a process where tunecl registered the "
                      "opencl device (torch takes opencl for its accelerator: pytorch/pytorch#161129); run CUDA "
                      "training in a process that does not import tunecl.backend")
_on_calling_thread = False   # an engine without a queue for the device was met: run every backward so


def on_calling_thread() -> bool:
    """Whether backward passes run on their calling thread because the engine has no opencl queue."""
    return _on_calling_thread


def patch() -> None:
    """Wrap torch's entry to the autograd engine (once per process)."""
    original = graph._engine_run_backward
    if getattr(original, "_tunecl", False):
        return
    engine_run_backward = wrap(original)
    graph._engine_run_backward = engine_run_backward
    torch.autograd._engine_run_backward = engine_run_backward   # (torch.autograd.backward/grad call it by name)


def wrap(original: Any) -> Any:
    """torch's engine entry ``original`` made to run as this module describes."""
    @functools.wraps(original)
    def engine_run_backward(*args: Any, **kwargs: Any) -> Any:
        try:
            return _run(original, *args, **kwargs)
        except RuntimeError as error:
            if _CUDA_STREAM_ASSERT in str(error):
                raise RuntimeError(CUDA_BACKWARD_HINT) from error
            raise

    engine_run_backward._tunecl = True  # type: ignore[attr-defined]
    return engine_run_backward


def _on_caller(cfg: config.Config) -> bool:
    return cfg.backward_thread != "worker"


_caller_setting = config.Derived(_on_caller, "TUNECL_BACKWARD_THREAD")


def runs_on_caller() -> bool:
    """Whether opencl backward passes run on their calling thread (the setting, or an engine without a queue)."""
    return _on_calling_thread or _caller_setting()


def _run(original: Any, *args: Any, **kwargs: Any) -> Any:
    global _on_calling_thread
    if not _on_calling_thread and not _caller_setting():
        try:
            return original(*args, **kwargs)
        except RuntimeError as error:
            if _ENGINE_ASSERT not in str(error):
                raise
            _on_calling_thread = True
    with torch.autograd.set_multithreading_enabled(False):
        return original(*args, **kwargs)
