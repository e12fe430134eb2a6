"""Exceptions tunecl raises on purpose. Each :class:`TuneclError`'s message is meant to be shown to a user
as is; :class:`Unsupported` is a signal between layers instead, importable by every one of them."""


class TuneclError(Exception):
    """Base class of every error tunecl raises deliberately."""


class DeviceNotFoundError(TuneclError, LookupError):
    """A device selector matched no OpenCL device (the message lists those available)."""


class BuildError(TuneclError):
    """An OpenCL program failed to compile; the message carries the build log."""


class WorkGroupTooLargeError(BuildError):
    """A kernel compiled, but this device cannot launch it at the work-group size its config needs
    (each work-item uses too many registers)."""


class DatabaseError(TuneclError):
    """The tuning database could not be read or written."""


class SchemaVersionError(DatabaseError):
    """The tuning database's schema does not match this version of tunecl."""


class ImportFormatError(TuneclError, ValueError):
    """An exported tuning document is malformed, truncated, of another format or of a newer version."""


class Unsupported(Exception):
    """A kernel family or a backend adapter cannot compute this case (dtype, rank, ...); the caller picks
    another path (the backend falls back to the CPU)."""
