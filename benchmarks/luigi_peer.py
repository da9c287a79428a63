#!/usr/bin/env python3
"""The luigi side of benchmarks/run.py: the same workloads as luigi tasks (a peer only).

Run by benchmarks/run.py with a Python that has luigi (``pip install luigi``, e.g. in a
separate virtualenv, ``--luigi-python``); planrun never imports it.

    python luigi_peer.py chain N DIR          # W1: s1 <- s2 <- ... <- sN, no-op tasks
    python luigi_peer.py parallel N SECONDS DIR  # W3: N independent sleeps, N workers
    python luigi_peer.py marks N DIR          # W4: chain of N tasks appending to $BENCH_EFFECTS

Each task's state is a ``luigi.LocalTarget`` file in DIR (luigi writes it to a temporary
name and renames it: atomic, but not fsynced — luigi's own durability). ``BENCH_CRASH=K``
SIGKILLs the process when task K starts (before its effect), as planrun's
``PLANRUN_TEST_CRASH=dispatch:sK``; running the same command again resumes: luigi skips
the tasks whose target exists. Exit status 0 when luigi reports success.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import luigi


class Chain(luigi.Task):
    n = luigi.IntParameter()
    root = luigi.Parameter()
    mark = luigi.BoolParameter(default=False)

    def requires(self):  # type: ignore[no-untyped-def]
        return Chain(n=self.n - 1, root=self.root, mark=self.mark) if self.n > 1 else []

    def output(self):  # type: ignore[no-untyped-def]
        return luigi.LocalTarget(os.path.join(self.root, f"s{self.n}.done"))

    def run(self) -> None:
        if os.environ.get("BENCH_CRASH") == str(self.n):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.mark:
            line = f"{self.n} {time.time():.6f}\n".encode()
            fd = os.open(os.environ["BENCH_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                         0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        with self.output().open("w") as f:
            f.write("done\n")


class Nap(luigi.Task):
    i = luigi.IntParameter()
    seconds = luigi.FloatParameter()
    root = luigi.Parameter()

    def output(self):  # type: ignore[no-untyped-def]
        return luigi.LocalTarget(os.path.join(self.root, f"p{self.i}.done"))

    def run(self) -> None:
        time.sleep(self.seconds)
        with self.output().open("w") as f:
            f.write("done\n")


class Naps(luigi.WrapperTask):
    n = luigi.IntParameter()
    seconds = luigi.FloatParameter()
    root = luigi.Parameter()

    def requires(self):  # type: ignore[no-untyped-def]
        return [Nap(i=i, seconds=self.seconds, root=self.root) for i in range(1, self.n + 1)]


def main(argv: list[str]) -> int:
    kind = argv[0]
    if kind == "chain":
        tasks, workers = [Chain(n=int(argv[1]), root=argv[2])], 1
    elif kind == "marks":
        tasks, workers = [Chain(n=int(argv[1]), root=argv[2], mark=True)], 1
    elif kind == "parallel":
        tasks, workers = [Naps(n=int(argv[1]), seconds=float(argv[2]), root=argv[3])], \
            int(argv[1])
    else:
        raise SystemExit(f"unknown workload {kind!r}")
    ok = luigi.build(tasks, local_scheduler=True, workers=workers, log_level="ERROR")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
