"""tunecl: OpenCL devices for PyTorch, made fast by measurement."""

__version__ = "0.1.0"
