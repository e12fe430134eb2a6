"""What the ``tunecl db`` subcommands work on: the DB of ``--db`` (:func:`db_url`) and the devices
``--device`` selects (:func:`select_devices`)."""

from __future__ import annotations

import argparse
from typing import Any

from tunecl import config
from tunecl.errors import DeviceNotFoundError, TuneclError


def db_url(args: argparse.Namespace) -> Any:
    """The SQLAlchemy URL of ``--db`` (default: ``TUNECL_DB``, else the user data folder)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    raw = config.normalize_db_url(args.db) if args.db else config.get().db_url
    try:
        return make_url(raw)
    except ArgumentError:
        raise TuneclError(f"not a database URL or file path: {raw!r}") from None


def select_devices(selector: str, stored: list[Any], where: str) -> list[Any]:
    """The devices (fingerprints) ``selector`` names: a device of this machine, or those of ``stored``.

    An index or ``platform:device`` of a device of this machine selects that device; any other selector,
    and a number this machine has no device for (``4090``), is matched against the ``stored`` devices
    (:mod:`tunecl.db.selection`), so another machine's results can be selected too.

    Raises:
        DeviceNotFoundError: nothing matches (the message lists the stored devices, ``where`` names
            where they are stored).
    """
    from tunecl.db.selection import describe, is_local_form, stored_matches

    local_miss = None
    if is_local_form(selector):
        # the runtime loads pyopencl; only the forms that name this machine's devices pay for it
        from tunecl import runtime

        try:
            return [runtime.select_device(selector).fingerprint]
        except DeviceNotFoundError:
            if ":" in selector:  # platform:device means nothing among stored devices
                raise
            local_miss = f"no OpenCL device number {selector.strip()} on this machine, and "
    matches = stored_matches(selector, stored)
    if not matches:
        raise DeviceNotFoundError(f"{local_miss or ''}no device stored in {where} matches "
                                  f"{selector!r}; {describe(stored)}")
    return matches
