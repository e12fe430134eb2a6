"""Which stored devices a ``--device`` selector of the ``tunecl db`` commands names.

The DB holds results of devices that need not be in this machine (another machine's export, the
shipped results merged in), so a selector is matched against the devices stored in the DB:

- a key as ``tunecl db stats`` prints it (``Fingerprint.key``) or a model key (``Fingerprint.model_key``);
- a case-insensitive part of a stored device's label (name and driver), vendor, platform or device
  version (``h200``, ``nvidia``, ``pocl``): every stored device that has it.

Each match stands for its device model, any driver. The forms that only mean something on this
machine, an index (``0``) and ``platform:device`` (``1:0``), are the caller's to resolve (see
:func:`is_local_form`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tunecl.fingerprint import Fingerprint


def is_local_form(selector: str) -> bool:
    """Whether ``selector`` is an index or a ``platform:device`` pair of this machine's OpenCL devices."""
    return re.fullmatch(r"\d+|\d+\s*:\s*\d+", selector.strip()) is not None


def stored_matches(selector: str, stored: Sequence[Fingerprint]) -> list[Fingerprint]:
    """The stored devices ``selector`` names, in ``stored``'s order: those whose key or model key it is,
    else those with it in their label, vendor, platform or device version. Empty: none."""
    needle = selector.strip().lower()
    if not needle:
        return []
    by_key = [fp for fp in stored if needle in (fp.key, fp.model_key)]
    return by_key or [fp for fp in stored if needle in _search_text(fp)]


def describe(stored: Sequence[Fingerprint]) -> str:
    """The stored devices for an error message: ``label [key]``, one per device."""
    if not stored:
        return "the DB holds no results yet"
    return "stored devices: " + "; ".join(f"{fp.label} [{fp.key}]" for fp in stored)


def _search_text(fp: Fingerprint) -> str:
    return f"{fp.label} {fp.vendor} {fp.platform} {fp.device_version}".lower()
