"""``python -m conv1d_silu info [--shape S,C[,K]] [--layout BCL]``: versions, GPU, kernels, cache, routes."""

from __future__ import annotations

import argparse
import platform
import sys


def info(shape: tuple[int, ...] | None, dtype_name: str, layout: str = "BLC") -> int:
    import torch

    from . import __version__, kernels, routes, runtime, warmup

    print(f"conv1d_silu {__version__}  python {platform.python_version()}  torch {torch.__version__}")
    cp = runtime._cupy()
    print(f"cupy {cp.__version__ if cp else 'not installed (pip install conv1d_silu[cuda])'}")
    if not torch.cuda.is_available():
        print("CUDA: no device visible; the PyTorch reference serves the ops on the CPU")
        arch = "sm_90"
        print(f"(routes below are shown for {arch})")
    else:
        dev = torch.cuda.current_device()
        cap = torch.cuda.get_device_capability(dev)
        arch = routes.arch_of(cap)
        print(f"GPU {torch.cuda.get_device_name(dev)}  capability {cap[0]}.{cap[1]}  route arch {arch}  "
              f"torch CUDA {torch.version.cuda}")
        if cp is not None:
            print(f"CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}  driver {cp.cuda.runtime.driverGetVersion()}  "
                  f"NVRTC {cp.cuda.nvrtc.getVersion()}")
            try:
                n = warmup()
                print(f"kernels: compiled and ran ({n} warm-up calls)")
            except Exception as err:  # report, don't crash the info command
                print(f"kernels: FAILED: {err}")
    print(f"kernel cache: {runtime.cache_dir()}  sources: {', '.join(f'{s} ({kernels.source_hash(s)})' for s in kernels.SOURCES)}")
    if shape:
        S, C = shape[0], shape[1]
        K = shape[2] if len(shape) > 2 else 4
        print(f"\nroutes for S={S}, C={C}, K={K}, {dtype_name}, x {layout} on {arch}:")
        for variant in routes.VARIANTS:
            rule = routes.rule_for(arch, variant, C, S, K, dtype_name, layout)
            print(f"  {variant:<15} -> {rule.program:<17} ({rule.condition})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conv1d_silu")
    sub = p.add_subparsers(dest="command", required=True)
    q = sub.add_parser("info", help="versions, GPU, kernels, cache dir, and routes for a shape")
    q.add_argument("--shape", type=lambda s: tuple(int(v) for v in s.split(",")), help="S,C[,K]")
    q.add_argument("--dtype", default="bfloat16")
    q.add_argument("--layout", choices=("BLC", "BCL"), default="BLC", help="x channel-last or channel-first")
    args = p.parse_args(argv)
    return info(args.shape, args.dtype, args.layout)


if __name__ == "__main__":
    sys.exit(main())
