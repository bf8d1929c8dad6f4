"""Compile a list of kernel instances into CuPy's cache on every core, before the GPU suite needs them.

    python3 tools/warm_kernels.py LIST [--jobs N]

LIST holds ``source<TAB>name expression`` lines, as the runtime appends them to
``CONV1D_SILU_RECORD_INSTANCES`` (tools/gpu-check records every run's into ``.cache/instances.txt``).
After a kernel-text change every cached cubin is stale and the suite's workers compile about a
thousand instances one test after another (one test alone compiled for 410 s on an H100 machine);
compiled here first, in parallel, the tests load them. An instance the current source no longer
has (a template changed its parameters) is counted and dropped: the list is rewritten with the
distinct instances that compiled.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def instances(path: Path) -> list[tuple[str, str]]:
    """The distinct (source, name expression) pairs of a list, in their first order."""
    seen: dict[tuple[str, str], None] = {}
    for line in path.read_text().splitlines():
        source, sep, kernel = line.partition("\t")
        if sep and source and kernel:
            seen.setdefault((source, kernel), None)
    return list(seen)


def compile_one(pair: tuple[str, str]) -> str | None:
    """Compile (or load from the cache) one instance on device 0; its error, or None."""
    from conv1d_silu import runtime

    try:
        runtime.function(*pair, 0)
    except runtime.CompileError as err:
        return f"{pair[1]}: {str(err).splitlines()[0]}"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("list", type=Path)
    p.add_argument("--jobs", type=int, default=multiprocessing.cpu_count())
    args = p.parse_args(argv)
    os.environ.pop("CONV1D_SILU_RECORD_INSTANCES", None)  # the workers add nothing to the list being read
    pairs = instances(args.list) if args.list.exists() else []
    t0 = time.monotonic()
    if args.jobs <= 1:
        errors = [compile_one(pair) for pair in pairs]
    else:  # spawn: each worker makes its own CUDA context
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            errors = list(pool.map(compile_one, pairs, chunksize=4))
    failed = [e for e in errors if e]
    if pairs:
        args.list.write_text("".join(f"{s}\t{k}\n" for (s, k), e in zip(pairs, errors) if not e))
    for e in failed[:10]:
        print(e, file=sys.stderr)
    print(f"warm_kernels: {len(pairs) - len(failed)} of {len(pairs)} instances ready in {time.monotonic() - t0:.0f} s"
          f"{f', {len(failed)} no longer in the source' if failed else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
