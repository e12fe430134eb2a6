"""The library wing: the untuned kernels the PyTorch backend runs for its other ops (pointwise,
reductions, norms, pooling, losses, optimizer steps, indexing, scans, sorting, random numbers, upsampling,
the transformer helpers and ``torch.compile``'s fused chains), each one module and one ``.cl`` file, with
the ``.cl`` files they include (``elementwise_meta.cl``, ``local_sums.cl``).
"""
