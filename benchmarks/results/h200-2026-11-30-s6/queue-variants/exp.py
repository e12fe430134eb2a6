"""Bench under a queue variant (EXP): plain (as shipped), profiling (backend keeps the profiling queue),
flushN (clFlush after every N uses of the queue)."""
import os
import sys

from tunecl import runtime

mode = os.environ.get("EXP", "plain")
if mode == "profiling":
    runtime.Device.set_profiling_default = lambda self, enabled: None
elif mode.startswith("flush"):
    every = int(mode[5:])
    prop = runtime.Device.queue

    def queue(self):
        self._uses = getattr(self, "_uses", 0) + 1
        q = prop.fget(self)
        if self._uses % every == 0:
            q.flush()
        return q
    runtime.Device.queue = property(queue)
from tunecl.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
