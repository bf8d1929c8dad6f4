"""Where a kernel's time goes between its CTAs: every work unit records %globaltimer at its start,
when its rows are done (backward: before the fold) and at its end, and its SM (text patches of the
kernel sources, as in ab_experiment.py); the fold kernel's CTAs (gpu.split_fold) record their start,
the return of their griddepcontrol.wait, the end of the first level (read from the workspace) and their
end. One cold-L2 launch per (program, shape), bf16, K = 4, bias.

    PROGS="rowgroup_long_8b fwd_rows_8b" python3 scripts/cta_timeline.py S:C ...

Prints one JSON line per case: the span, unit durations (quantiles), how long the machine runs with
fewer than half / 90 % of its slots busy, and the spread of work between SMs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import kernels, ops, routes, runtime  # noqa: E402
from conv1d_silu.tune import _setup  # noqa: E402

_source = kernels.source.__wrapped__
N_TRACE = 1 << 17  # units traced (4 words each)
GLOBAL = "__device__ unsigned long long c1s_trace[%d];\n" % (4 * N_TRACE)
STAMP = ("if (threadIdx.x == 0 && unit < %d) { unsigned long long t_; asm volatile(\"mov.u64 %%0, %%%%globaltimer;\" "
         ": \"=l\"(t_)); c1s_trace[4 * unit + {slot}] = t_; }" % N_TRACE)
SMID = ("if (threadIdx.x == 0 && unit < %d) { unsigned s_; asm(\"mov.u32 %%0, %%%%smid;\" : \"=r\"(s_)); "
        "c1s_trace[4 * unit + 3] = s_; }" % N_TRACE)
LOOP = "  for (long long unit = blockIdx.x; unit < n_units; unit += gridDim.x) {\n"
N_FOLD = 1 << 12  # fold CTAs traced (4 words each)
FOLD_GLOBAL = "__device__ unsigned long long c1s_ftrace[%d];\n" % (4 * N_FOLD)
FSTAMP = ("if (threadIdx.x == 0 && blockIdx.x < %d) { unsigned long long t_; asm volatile(\"mov.u64 %%0, %%%%globaltimer;\" "
          ": \"=l\"(t_)); c1s_ftrace[4 * blockIdx.x + {slot}] = t_; }\n" % N_FOLD)
FOLD_START = "  const A* ws = static_cast<const A*>(workspace);\n"  # before the warm pass
FOLD_WAIT = "      griddep_wait();\n"
FOLD_LOADED = "    int src = 0, dst = np;\n"  # the first level folded (each pass; the real one stamps last)
FOLD_END = "      const int t = src;\n      src = dst;\n      dst = t;\n    }\n  }\n"
PATCHES = {
    "conv1d_silu_bwd": [
        ("}  // namespace c1s\n", "}  // namespace c1s\n" + GLOBAL + FOLD_GLOBAL),
        (LOOP, LOOP + STAMP.replace("{slot}", "0") + SMID + "\n"),
        (FOLD_START, FSTAMP.replace("{slot}", "0") + FOLD_START),
        (FOLD_WAIT, FOLD_WAIT + FSTAMP.replace("{slot}", "1")),
        (FOLD_LOADED, FSTAMP.replace("{slot}", "2") + FOLD_LOADED),
        (FOLD_END, FOLD_END + FSTAMP.replace("{slot}", "3")),
        ("    __syncthreads();\n\n    // Fold the LANES", "    __syncthreads();\n" + STAMP.replace("{slot}", "1")
         + "\n\n    // Fold the LANES"),
        ("    __syncthreads();  // the slots and the plans are reused by the next unit\n",
         "    __syncthreads();  // the slots and the plans are reused by the next unit\n"
         + STAMP.replace("{slot}", "2") + "\n"),
    ],
    "conv1d_silu_fwd": [
        ("}  // namespace c1s\n", "}  // namespace c1s\n" + GLOBAL),
        (LOOP, LOOP + STAMP.replace("{slot}", "0") + SMID + "\n"),
        ("          if (i0 + decltype(p)::value < rows) step(p, i0 + decltype(p)::value);\n        });\n      }\n    }\n",
         "          if (i0 + decltype(p)::value < rows) step(p, i0 + decltype(p)::value);\n        });\n      }\n    }\n"
         + STAMP.replace("{slot}", "1") + STAMP.replace("{slot}", "2") + "\n"),
    ],
}


def patched(src: str) -> str:
    text = _source(src)
    for old, new in PATCHES.get(src, []):
        assert text.count(old) == 1, (src, old[:60])
        text = text.replace(old, new)
    return text


_modules: list = []  # every RawModule the runtime builds, newest last


def _record_modules() -> None:
    import cupy as cp

    class Recording(cp.RawModule):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            _modules.append(self)

    cp.RawModule = Recording


def _trace(name: str = "c1s_trace", n: int = N_TRACE, module: int = -1) -> torch.Tensor:
    import cupy as cp

    ptr = _modules[module].get_global(name)
    return torch.as_tensor(cp.ndarray((4 * n,), dtype=cp.uint64, memptr=ptr).view(cp.int64), device="cuda")


def fold_times(ft: torch.Tensor, t0: float, main_end: float) -> dict:
    """The fold kernel's CTAs against the backward's: first start, the waits' returns, last end (µs
    from the backward's first unit start), and how long after the backward's last unit it ends."""
    t = ft.view(-1, 4)
    t = t[t[:, 0] > 0].double()
    if not t.shape[0]:
        return {}
    start, woke, loaded, end = ((t[:, i] - t0) / 1e3 for i in range(4))
    return {
        "fold_ctas": int(t.shape[0]), "fold_start_min_max_us": [round(float(start.min()), 2), round(float(start.max()), 2)],
        "fold_wait_return_min_max_us": [round(float(woke.min()), 2), round(float(woke.max()), 2)],
        "fold_first_level_min_max_us": [round(float(loaded.min()), 2), round(float(loaded.max()), 2)],
        "fold_end_max_us": round(float(end.max()), 2),
        "fold_end_after_bwd_us": round(float(end.max()) - main_end, 2),
    }


def analyse(tr: torch.Tensor, n_sm: int, ft: torch.Tensor | None = None) -> dict:
    t = tr.view(-1, 4)
    t = t[t[:, 0] > 0].double()
    t0 = t[:, 0].min()
    start, rows, end, sm = (t[:, 0] - t0) / 1e3, (t[:, 1] - t0) / 1e3, (t[:, 2] - t0) / 1e3, t[:, 3].long()
    span = float(end.max())
    dur = end - start
    q = torch.tensor([0.1, 0.5, 0.9, 1.0], dtype=torch.float64)
    # active units over time (1000 samples of the span)
    grid = torch.linspace(0, span, 1000, dtype=torch.float64)
    active = ((start[None, :] <= grid[:, None]) & (end[None, :] > grid[:, None])).sum(1).double()
    peak = float(active.max())
    per_sm = torch.bincount(sm, weights=dur, minlength=n_sm)
    return {
        "units": int(t.shape[0]), "span_us": round(span, 1),
        "unit_us_q10_50_90_max": [round(v, 1) for v in torch.quantile(dur, q).tolist()],
        "fold_us_median": round(float((end - rows).median()), 2),
        "last_start_us": round(float(start.max()), 1),
        "end_q50_q90_us": [round(v, 1) for v in torch.quantile(end, q[1:3]).tolist()],
        "peak_active": peak,
        "time_below_90pct_us": round(float((active < 0.9 * peak).double().mean()) * span, 1),
        "time_below_50pct_us": round(float((active < 0.5 * peak).double().mean()) * span, 1),
        "sm_busy_us_min_med_max": [round(float(v), 1) for v in (per_sm.min(), per_sm.median(), per_sm.max())],
        **(fold_times(ft, float(t0), span) if ft is not None else {}),
    }


def main(shapes: list[str]) -> None:
    kernels.source = patched
    _record_modules()
    dev = torch.device("cuda")
    n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
    flush = torch.empty(256 * 2**20 // 4, device=dev)
    progs = os.environ.get("PROGS", "rowgroup_long_8b rowgroup_8b fwd_rows_8b").split()
    for shape in shapes:
        S, C = (int(v) for v in shape.split(":"))
        x, dy, w, b, doc, gd = _setup("bwd_bias", S, C, 4, torch.bfloat16, dev)
        for prog in progs:
            runtime._functions.clear()
            if routes.PROGRAMS[prog].direction == "bwd":
                call = lambda: ops.backward_impl(dy, x, w, b, doc, None, None, True, gd, prog)  # noqa: E731
            else:
                call = lambda: ops.forward_impl(x, w, b, doc, None, False, True, prog)  # noqa: E731
            first = len(_modules)
            call()
            built = len(_modules) - first  # the kernel's module, then the fold kernel's if it launched
            tr = _trace(module=first)
            ft = _trace("c1s_ftrace", N_FOLD, first + 1) if built > 1 else None
            rows = []
            for _ in range(3):
                for buf in (tr, ft):
                    if buf is not None:
                        buf.zero_()
                flush.fill_(1.0)
                torch.cuda.synchronize()
                call()
                torch.cuda.synchronize()
                rows.append(analyse(tr.cpu(), n_sm, None if ft is None else ft.cpu()))
            best = min(rows, key=lambda r: r["span_us"])
            print(json.dumps({"S": S, "C": C, "prog": prog, **best}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
