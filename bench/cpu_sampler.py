"""Run a module under a CPU-time sampler: `python -m bench.cpu_sampler OUT -m MODULE [args]`.

Every millisecond of the process's CPU time (ITIMER_PROF: all threads, not wall time, so
other jobs on a shared machine do not add samples) the main thread's Python stack is recorded;
the collapsed stacks ("frame;frame;... count") are written to OUT at exit or on SIGUSR1. CPU
spent in gRPC's C threads lands on whatever the main thread runs then (the event loop), and
time in a C call is counted at the next Python call, so read the figures per function, not
per line. py-spy's --gil sampling counts wall time and was dominated by other jobs' CPU here.
"""
from __future__ import annotations

import atexit
import collections
import os
import runpy
import signal
import sys
from types import FrameType


def main() -> None:
    out, flag, module = sys.argv[1], sys.argv[2], sys.argv[3]
    if flag != "-m":
        raise SystemExit("usage: python -m bench.cpu_sampler OUT -m MODULE [args]")
    sys.argv = [module, *sys.argv[4:]]
    counts: collections.Counter[str] = collections.Counter()

    def sample(_sig: int, frame: FrameType | None) -> None:
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append(f"{code.co_name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})")
            frame = frame.f_back
        counts[";".join(reversed(stack))] += 1

    def dump(*_: object) -> None:
        with open(out, "w") as fh:
            fh.writelines(f"{stack} {n}\n" for stack, n in counts.most_common())

    signal.signal(signal.SIGPROF, sample)
    signal.signal(signal.SIGUSR1, dump)
    signal.setitimer(signal.ITIMER_PROF, 0.001, 0.001)
    atexit.register(dump)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
