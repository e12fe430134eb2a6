"""The CTC loss (``ctc.cl``): the alpha recursion and the loss, then the beta recursion and the gradient wrt
the log-probabilities, one work-group per sample for the recursions."""

from __future__ import annotations

from tunecl.errors import Unsupported
from tunecl.kernels.sizes import round_up
from tunecl.kernels.strided import Operand, StridedFamily, meta_dtype, pack_meta, work_group
from tunecl.runtime import Device

_REALS = {"float32": "float"}
_RECURSION_GROUP = 128   # work-items sharing one sample's positions (2L + 1 of them)


class Ctc(StridedFamily):
    source_file = "ctc.cl"

    def __init__(self, device: Device):
        super().__init__(device)
        self.recursion_group = work_group(device, _RECURSION_GROUP)

    def _kernel(self, name: str, real: str, buffers: int):
        key = (name, real)
        kernel = self.cache.get(key)
        if kernel is None:
            kernel = self.cache.build(key, [f"-DREAL={real}"], name, [None] * buffers + [meta_dtype(20, "long")])
        return kernel

    @staticmethod
    def _meta(sizes: tuple[int, int, int, int], blank: int, zero_infinity: bool, log_probs: Operand,
              targets: Operand, nll: Operand, grad_out: Operand | None, offsets: tuple[int, ...]) -> bytes:
        go = (0, 0) if grad_out is None else (grad_out.offset, grad_out.strides[0])
        return pack_meta([*sizes, blank, int(zero_infinity), log_probs.offset, *log_probs.strides,
                          targets.strides[0], nll.offset, nll.strides[0], *go, *offsets], "long")

    def _real(self, *operands: Operand) -> str:
        dtypes = {o.dtype for o in operands}
        if len(dtypes) != 1 or next(iter(dtypes)) not in _REALS:
            raise Unsupported(f"ctc_loss of {sorted(dtypes)}")
        return _REALS[next(iter(dtypes))]

    def forward(self, sizes: tuple[int, int, int, int], blank: int, log_probs: Operand, targets: Operand,
                info: Operand, nll: Operand, log_alpha: Operand) -> None:
        """``nll`` (N,) and ``log_alpha`` (N, T, W), both contiguous, of ``log_probs`` (T, N, C) and int64
        ``targets`` (``targets.strides[0]`` steps along a sample's labels); ``info`` (N, 3) contiguous int64:
        each sample's input length, target length and targets' element offset. ``sizes`` = (T, N, C, W)."""
        real = self._real(log_probs, nll, log_alpha)
        n = sizes[1]
        meta = self._meta(sizes, blank, False, log_probs, targets, nll, None,
                          (log_alpha.offset, 0, 0, info.offset, 0))
        group = self.recursion_group
        self._kernel("ctc_alpha", real, 5)(self.device.queue, (n * group,), (group,), nll.buffer, log_alpha.buffer,
                                            log_probs.buffer, targets.buffer, info.buffer, meta)

    def backward(self, sizes: tuple[int, int, int, int], blank: int, zero_infinity: bool, log_probs: Operand,
                 targets: Operand, info: Operand, nll: Operand, log_alpha: Operand, grad_out: Operand,
                 log_beta: Operand, links: Operand, grad: Operand) -> None:
        """``grad`` ((T, N, C) contiguous) = the gradient wrt ``log_probs`` given ``grad_out`` (N,), from the
        forward's ``nll`` (N,) and ``log_alpha`` ((N, T, W) contiguous); ``log_beta`` (log_alpha's shape) and
        ``links`` ((N, W // 2, 2) int64, at least one element) are scratch. The other operands are as for
        :meth:`forward`."""
        real = self._real(log_probs, nll, log_alpha, grad_out, log_beta, grad)
        t, n, c, width = sizes
        meta = self._meta(sizes, blank, zero_infinity, log_probs, targets, nll, grad_out,
                          (log_alpha.offset, log_beta.offset, grad.offset, info.offset, links.offset))
        queue = self.device.queue
        group = self.recursion_group
        self._kernel("ctc_beta", real, 5)(queue, (n * group,), (group,), log_beta.buffer, nll.buffer,
                                           log_probs.buffer, targets.buffer, info.buffer, meta)
        longest = width // 2
        if longest:
            self._kernel("ctc_links", real, 3)(queue, (round_up(n * longest, self.local),), (self.local,),
                                                links.buffer, targets.buffer, info.buffer, meta)
        self._kernel("ctc_grad", real, 5)(queue, (round_up(t * n * c, self.local),), (self.local,), grad.buffer,
                                           nll.buffer, grad_out.buffer, log_probs.buffer, info.buffer, meta)
        self._kernel("ctc_grad_labels", real, 9)(
            queue, (round_up(t * n * (longest + 1), self.local),), (self.local,), grad.buffer, log_alpha.buffer,
            log_beta.buffer, nll.buffer, grad_out.buffer, log_probs.buffer, targets.buffer, info.buffer,
            links.buffer, meta)
