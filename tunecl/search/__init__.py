"""The search layer: verify and time candidates, search spaces with Optuna, pick verified winners.

Imports optuna and ``tunecl.kernels``, never ``tunecl.db`` or ``tunecl.backend`` (``tunecl/tune.py``
is where search and the tuning DB meet).

- :mod:`~tunecl.search.result` — ``Status`` and the frozen ``Result`` every evaluation returns;
- :mod:`~tunecl.search.harness` — per problem kind: inputs, reference, guarded buffers, compare
  (``harness_conv`` for convolutions, ``harness_attention`` for attention, torch references);
  :mod:`~tunecl.search.harness_registry` — which harness checks which kind (``harness_for``);
- :mod:`~tunecl.search.measure` — device-event timing with warm-up, repeats and a timeout;
- :mod:`~tunecl.search.evaluate` — ``evaluate(...)``: check, build, verify, time; never raises;
- :mod:`~tunecl.search.space` — the joint space of the applicable algorithms;
- :mod:`~tunecl.search.budget` — ``Budget``, ``Progress``, ``SearchLog`` and what the driver reads of
  a strategy;
- :mod:`~tunecl.search.strategies` — exhaustive, grid, random and TPE strategies on Optuna studies;
- :mod:`~tunecl.search.driver` — the ask/check/evaluate/tell loop with resume and re-measurement;
  :mod:`~tunecl.search.batching` — its batched form (``jobs > 1``);
  :mod:`~tunecl.search.coordination` — the study's trials as one worker knows them, shared with others;
- :mod:`~tunecl.search.claims` — claims on whole problems between ``tune --net`` processes;
- :mod:`~tunecl.search.tuner` — ``Tuner.tune(problem)``: a resumable study per problem and device.
"""

from tunecl.search.result import Result, Status

__all__ = ["Result", "Status"]
