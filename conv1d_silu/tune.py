"""Route tuner: ``python -m conv1d_silu.tune``.

On the current GPU, times every channel-last program of each variant (forward and backward) over a
grid of C (64..5120, every 8 from 256 to 512, Mamba's 2560 and 5120) and S (512 .. 262144, 1048576),
bf16, K = 4, cold L2, medians of CUDA-graph replays, and chooses this arch's route table: a
non-default program is routed for a C band from a token floor only where it beat the default by more
than the noise margin at that floor and at every larger S measured. All backward programs give the
same bits (canonical reduction), so a route changes speed only.

Files written (the installed package is never written unless --write-package is given):
  OUT/<arch>.json       the route table, in the format of conv1d_silu/route_tables/<arch>.json; it
                        lists the variants measured (the others route to the default program) and
                        keeps the package table's channel-first rules, which the tuner does not time
  OUT/routes-<arch>.md  the evidence: every time measured and the program each point routes to
  OUT is --out DIR, by default ./tune-<arch>/ in the current directory.
  --write-package       also writes conv1d_silu/route_tables/<arch>.json, the table the package
                        routes by; refused unless the package is a writable source checkout
                        (pyproject.toml beside it, not under site-packages). Without it, copy
                        OUT/<arch>.json there by hand to use it.
  --json FILE           dumps the measurements. --from-json FILE [FILE ...] chooses the routes
                        again from such dumps, without a GPU, and writes both files, e.g. to
                        regenerate the evidence: python -m conv1d_silu.tune --from-json tune.json --out DIR
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from . import gpu, ops, routes, runtime
from .bench import Timer
from .documents import doc_table

PACKAGE = Path(__file__).resolve().parent  # conv1d_silu/
# 2560 and 5120 are Mamba's widths, where an H100 run found another program 4-12 % faster than the
# one the 2048 point routes
DEFAULT_C = sorted({64, 128, 192, *range(256, 513, 8), 640, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120})
DEFAULT_S = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 196608, 262144, 1048576)  # dense below 262144: token floors fall on these
MARGIN = 0.03  # programs this close to the fastest count as tied
NOISE_CAP = 0.05  # a noisy measurement widens the tie to its spread, but never past this
BWD_VARIANTS = ("bwd", "bwd_bias", "bwd_dt", "bwd_fp32g", "bwd_bias_fp32g")
VARIANTS = ("fwd", "fwd_bias", "fwd_dt") + BWD_VARIANTS


@dataclass
class Measurement:
    variant: str
    C: int
    S: int
    times: dict[str, float]  # program -> median µs
    spread: dict[str, float]  # program -> (p75 - p25) / median


def _setup(variant: str, S: int, C: int, K: int, dtype: torch.dtype, device, random: bool = True):
    g = torch.Generator(device=device).manual_seed(S + C)
    if random:
        x = torch.randn(S, C, device=device, dtype=dtype, generator=g)
        dy = torch.randn(S, C, device=device, dtype=dtype, generator=g)
    else:  # shapes only (precompile)
        x = dy = torch.empty(S, C, device=device, dtype=dtype)
    w = torch.randn(C, K, device=device, dtype=dtype, generator=g)
    b = torch.randn(C, device=device, dtype=dtype, generator=g) if "bias" in variant or variant.endswith("_dt") else None
    cu = None
    if variant.endswith("_dt"):
        cuts = torch.sort(torch.randint(1, S, (max(1, S // 4096),), generator=g, device=device)).values
        cu = torch.cat([torch.zeros(1, device=device, dtype=cuts.dtype), cuts, torch.tensor([S], device=device)]).to(torch.int32)
    grad_dtype = torch.float32 if variant.endswith("fp32g") else dtype
    doc = doc_table(x, None, cu, None)
    return x, dy, w, b, doc, grad_dtype


class _Recorder(gpu.Launcher):
    """Collects the kernels a call would launch, launching nothing."""

    def __init__(self):
        self.kernels: set[tuple[str, str]] = set()

    def max_active_blocks(self, launch, device) -> int:
        # Unbounded residency: no lane height grows while recording (compiling nothing here); the
        # few wave-filling heights compile on first use, in the timer's warm-up.
        return 1 << 30

    def __call__(self, launch, device) -> None:
        self.kernels.add((launch.source, launch.kernel))


def _call(variant: str, name: str, x, dy, w, b, doc, grad_dtype):
    if variant.startswith("fwd"):
        return ops.forward_impl(x, w, b, doc, None, False, True, name)
    return ops.backward_impl(dy, x, w, b, doc, None, None, True, grad_dtype, name)


def _programs(variant: str, only: list[str] | None = None) -> list[str]:
    """The channel-last programs of the variant's direction (the grid's x is channel-last)."""
    return [
        n for n, p in routes.PROGRAMS.items()
        if p.direction == variant[:3] and p.layout == "BLC" and (not only or n in only)
    ]


def _timed(variant: str, C: int, S: int, K: int, dtype, programs, arch: str | None) -> list[str]:
    """The programs timed at one point: those asked for (default: every one) and, when only some
    are asked for, the program the current route picks there, so a program is rated against the
    incumbent in the same run (runs two days apart differ by up to 6 % at a point on the H200)."""
    names = _programs(variant, programs)
    if programs and arch:
        routed = routes.rule_for(arch, variant, C, S, K, routes.dtype_name(dtype)).program
        if routed not in names:
            names.append(routed)
    return names


def _compile(item: tuple[str, str]) -> str:
    runtime.function(*item, 0)
    return item[1]


def precompile(
    variants, Cs, Ss, K: int = 4, dtype=torch.bfloat16, jobs: int = 8, log=sys.stderr, programs=None
) -> int:
    """Compile every kernel the measurement will launch, ``jobs`` NVRTC processes at a time
    (CuPy's on-disk cache keeps them for the timing process); returns how many."""
    import concurrent.futures
    import multiprocessing

    recorder = _Recorder()
    device = torch.device("cuda")
    arch = ops._arch(device)
    with ops.use_launcher(recorder):
        for variant in variants:
            for S in Ss:
                for C in Cs:
                    x, dy, w, b, doc, grad_dtype = _setup(variant, S, C, K, dtype, device, random=False)
                    for name in _timed(variant, C, S, K, dtype, programs, arch):
                        _call(variant, name, x, dy, w, b, doc, grad_dtype)
    todo = sorted(recorder.kernels)
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        for i, _ in enumerate(pool.map(_compile, todo)):
            log.write(f"\rcompiled {i + 1}/{len(todo)}        ")
    log.write("\n")
    return len(todo)


def settled(sample: Callable[[], list[float]], rounds: int = 2) -> tuple[float, float]:
    """Median and spread (IQR / median) of ``sample()``'s timings; while the spread exceeds
    NOISE_CAP, up to ``rounds`` more samples join the first (a noisy point gets more replays
    instead of a wide tie in ``choose``)."""
    t = list(sample())
    while True:
        q = statistics.quantiles(t, n=4)
        med = statistics.median(t)
        spread = (q[2] - q[0]) / med
        if spread <= NOISE_CAP or rounds <= 0:
            return med, spread
        rounds -= 1
        t += sample()


def _point(variant: str, C: int, S: int, K: int, dtype, timer: Timer, programs) -> Measurement:
    """Every program's time at one (variant, C, S); the inputs die with the call."""
    x, dy, w, b, doc, grad_dtype = _setup(variant, S, C, K, dtype, timer.device)
    times, spread = {}, {}
    for name in _timed(variant, C, S, K, dtype, programs, ops._arch(timer.device)):
        call = functools.partial(_call, variant, name, x, dy, w, b, doc, grad_dtype)
        times[name], spread[name] = settled(functools.partial(timer, call))
    return Measurement(variant, C, S, times, spread)


def measure(
    variants, Cs, Ss, reps: int, K: int = 4, dtype=torch.bfloat16, log=sys.stderr, programs=None
) -> list[Measurement]:
    # graph replays: kernel time, no host overhead
    timer = Timer(torch.device("cuda"), reps, warmup=2, graph=True)
    out = []
    total = len(variants) * len(Cs) * len(Ss)
    i = 0
    for variant in variants:
        for S in Ss:
            for C in Cs:
                i += 1
                log.write(f"\r[{i}/{total}] {variant} S={S} C={C}        ")
                # from an empty cache, as the bench measures: right after a large free the 32-row
                # forwards run 10-11 % slower
                torch.cuda.empty_cache()
                out.append(_point(variant, C, S, K, dtype, timer, programs))
    log.write("\n")
    return out


def merge(dumps: list[dict]) -> tuple[list[Measurement], dict]:
    """Measurements of several ``--json`` dumps as one list (the first dump's meta): a (variant, C,
    S) in several dumps gets the union of their program times, later dumps winning."""
    merged: dict[tuple[str, int, int], Measurement] = {}
    for raw in dumps:
        for m in raw["measurements"]:
            key = (m["variant"], m["C"], m["S"])
            if key in merged:
                merged[key].times.update(m["times"])
                merged[key].spread.update(m["spread"])
            else:
                merged[key] = Measurement(m["variant"], m["C"], m["S"], dict(m["times"]), dict(m["spread"]))
    return list(merged.values()), dumps[0]["meta"]


def provenance(dumps: list[dict]) -> list[dict]:
    """Where the merged times come from: one entry per run (commit, date, GPU) with the variants,
    token counts and (when not all of them) programs it timed, in merge order. A run whose every
    (variant, S, program) a later run re-timed is dropped; a dump that is itself a merge gives its
    own parts."""
    parts: list[dict] = []
    for d in dumps:
        if d["meta"].get("parts"):
            parts += d["meta"]["parts"]
        elif d["measurements"]:
            ms = d["measurements"]
            variants = sorted({m["variant"] for m in ms})
            part = {"commit": d["meta"].get("commit"), "date": d["meta"].get("date"), "gpu": d["meta"].get("gpu"),
                    "variants": variants, "S": sorted({m["S"] for m in ms})}
            asked = d["meta"].get("programs")  # the routed program timed beside them is not a part's own
            timed = set(asked) if asked else {p for m in ms for p in m["times"]}
            if timed != {p for v in variants for p in _programs(v)}:
                part["programs"] = sorted(timed)
            parts.append(part)

    def cover(part: dict) -> set:
        return {
            (v, S, p) for v in part["variants"] for S in part["S"] for p in (part.get("programs") or _programs(v))
        }

    kept, later = [], set()
    for part in reversed(parts):
        mine = cover(part)
        if not mine <= later:
            kept.append(part)
        later |= mine
    runs: dict[tuple, dict] = {}  # one entry per run: a run's per-variant dumps share commit, date and grid
    for part in reversed(kept):
        key = tuple(str(part.get(k)) for k in ("commit", "date", "gpu", "S", "programs"))
        if key in runs:
            runs[key]["variants"] = sorted({*runs[key]["variants"], *part["variants"]})
        else:
            runs[key] = dict(part)
    return list(runs.values())


def _measured_at(meta: dict) -> str:
    """'commit X, date' of one run, or each part's commit (GPU, token counts, programs where
    given), variants and dates (for the evidence, which is never committed)."""
    if not meta.get("parts"):
        return f"commit {str(meta.get('commit'))[:10]}, {meta.get('date')}"
    groups: dict[tuple, list[dict]] = {}
    for p in meta["parts"]:
        key = (p.get("commit"), p.get("gpu"), tuple(p.get("S", ())), tuple(p.get("programs", ())))
        groups.setdefault(key, []).append(p)
    out = []
    for (commit, gpu_name, S, programs), parts in groups.items():
        dates = sorted(str(p.get("date")) for p in parts)
        when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
        what = ", ".join(sorted(v for p in parts for v in p["variants"]))
        what += f" at S = {', '.join(map(str, S))}" if S else ""
        what += f", programs {', '.join(programs)}" if programs else ""
        out.append(f"{str(commit)[:10]}{f' on {gpu_name}' if gpu_name else ''} ({what}: {when})")
    return "commits " + "; ".join(out)


def _gpus(meta: dict) -> str:
    """The GPU of a run, or every GPU its parts name."""
    names = {p["gpu"] for p in meta.get("parts", ()) if p.get("gpu")} | ({meta["gpu"]} if meta.get("gpu") else set())
    return " and ".join(sorted(names))


MEASURED_KEYS = ("gpu", "by", "dtype", "K", "dates")  # what the tuner writes in a table's "measured" block


def measured(meta: dict) -> dict:
    """A route table's "measured" block: the GPUs, the tool, dtype, K and the dates of the runs."""
    dates = sorted(str(p["date"])[:10] for p in (meta.get("parts") or [meta]) if p.get("date"))
    when = (dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}") if dates else None
    values = (_gpus(meta), "python -m conv1d_silu.tune", "bfloat16", 4, when)
    return {k: v for k, v in zip(MEASURED_KEYS, values) if v is not None}


def tolerance(m: Measurement, program: str, fastest: str, margin: float = MARGIN) -> float:
    """How much slower than ``fastest`` ``program`` may measure and still count as tied: the
    margin, widened by either spread (IQR / median) up to NOISE_CAP, so a noisy program cannot
    hide a large loss (9 replays at a million tokens can spread 10-19 %)."""
    return 1 + min(NOISE_CAP, max(margin, m.spread[program], m.spread[fastest]))


def routable(m: Measurement) -> Measurement:
    """``m`` with only the programs a route may name (``Program.routed``)."""
    keep = {p: t for p, t in m.times.items() if p in routes.PROGRAMS and routes.PROGRAMS[p].routed}
    return Measurement(m.variant, m.C, m.S, keep, m.spread)


def choose(ms: list[Measurement], margin: float = MARGIN) -> dict[str, list[routes.Rule]]:
    """Route rules from measurements: at every measured (C, S) the routed program is the measured
    fastest, or within ``tolerance`` of it.

    Among the programs within noise of the fastest, the pick prefers, in order: this C's pick at
    the previous S, the previous C's pick at this S, the default, then the fastest, so ties never
    split the table into noise-sized bands and the default is kept where nothing clearly beats it.
    Each C's picks become token-floored segments (a route may carry several per band; a floor sits at
    the geometric midpoint between the S where the pick changes and the S measured before); adjacent C
    with the same segment merge into one band ending at the next measured C. A segment naming the
    default is written only where a lower-floor rule would otherwise catch its tokens.
    """
    rules: dict[str, list[routes.Rule]] = {}
    for variant in sorted({m.variant for m in ms}):
        default = routes.default_rule(variant).program
        vm = [routable(m) for m in ms if m.variant == variant]
        Cs = sorted({m.C for m in vm})
        Ss = sorted({m.S for m in vm})
        table = {(m.C, m.S): m for m in vm}
        picks: dict[tuple[int, int], str] = {}
        for ci, C in enumerate(Cs):
            for si, S in enumerate(Ss):
                m = table[(C, S)]
                fastest = min(m.times, key=m.times.get)
                close = {
                    p for p, t in m.times.items()
                    if t <= m.times[fastest] * tolerance(m, p, fastest, margin)
                }
                prefer = [
                    picks.get((C, Ss[si - 1])) if si else None,
                    picks.get((Cs[ci - 1], S)) if ci else None,
                    default,
                    fastest,
                ]
                picks[(C, S)] = next(p for p in prefer if p in close)
        bands = []  # [c_lo, c_hi, program, floor]
        for ci, C in enumerate(Cs):
            c_hi = Cs[ci + 1] if ci + 1 < len(Cs) else routes.INF
            segments = []
            for si, S in enumerate(Ss):
                if not segments or segments[-1][0] != picks[(C, S)]:
                    # the switch lies between the last S measured before it and S: floor at the
                    # geometric midpoint, not at S (250340 tokens would otherwise take 196608's pick)
                    segments.append((picks[(C, S)], math.isqrt(Ss[si - 1] * S) if si else S))
            if segments[0][0] == default:
                segments = segments[1:]  # the default needs no rule below every other floor
            for program, floor in segments:
                same = [b for b in bands if b[1] == C and b[2:] == [program, floor]]
                if same:
                    same[0][1] = c_hi
                else:
                    bands.append([C, c_hi, program, floor])
        rules[variant] = [
            routes.Rule(program, lo, hi, floor) for lo, hi, program, floor in sorted(bands, key=lambda b: (-b[3], b[0]))
        ]
    return rules


def package_tables() -> Path:
    """The package's own route_tables folder, when the package is a writable source checkout;
    SystemExit with the reason otherwise (an installed package is never rewritten)."""
    tables = PACKAGE / "route_tables"
    why = None
    if {"site-packages", "dist-packages"} & set(PACKAGE.parts):
        why = "it lies under site-packages (an installed package)"
    elif not (PACKAGE.parent / "pyproject.toml").is_file():
        why = f"{PACKAGE.parent / 'pyproject.toml'} does not exist"
    elif not (tables.is_dir() and os.access(tables, os.W_OK)):
        why = f"{tables} is not a writable folder"
    if why:
        raise SystemExit(
            f"--write-package: {PACKAGE} is not a writable source checkout: {why}. Run from a git checkout "
            "of conv1d_silu, or leave out --write-package and copy OUT/<arch>.json into conv1d_silu/route_tables/ "
            "of a checkout."
        )
    return tables


def other_layouts(arch: str) -> tuple[dict[str, list[routes.Rule]], dict]:
    """The rules of the package's table for ``arch`` whose programs read x channel-first, and the
    entries its "measured" block holds beyond the tuner's own: the tuner times channel-last programs
    only, so a table it writes keeps these as they are."""
    path = PACKAGE / "route_tables" / f"{arch}.json"
    if not path.is_file():
        return {}, {}
    data = json.loads(path.read_text(encoding="utf-8"))
    _, table = routes.parse_table(data, str(path))
    kept = {v: [r for r in rs if routes.PROGRAMS[r.program].layout != "BLC"] for v, rs in table.items()}
    extra = {k: v for k, v in data["measured"].items() if k not in MEASURED_KEYS}
    return {v: rs for v, rs in kept.items() if rs}, extra


def write_table(path: Path, arch: str, rules: dict[str, list[routes.Rule]], meta: dict) -> Path:
    """The route table ``rules`` as ``path`` (``<arch>.json``), with the package table's channel-first
    rules first in their variants, checked by the loader before it lands."""
    kept, extra = other_layouts(arch)
    rules = {v: kept.get(v, []) + list(rules.get(v, [])) for v in routes.VARIANTS if v in rules or v in kept}
    text = routes.format_table(arch, {**measured(meta), **extra}, rules)
    routes.parse_table(json.loads(text), path.name)
    path.write_text(text)
    return path


def write_evidence(path: Path, arch: str, ms: list[Measurement], rules, meta: dict) -> Path:
    """Every time measured and the program each point routes to, as markdown (``routes-<arch>.md``)."""
    out = [
        f"# Route evidence for {arch}",
        "",
        f"Measured by `python -m conv1d_silu.tune` on {_gpus(meta)}, torch {meta.get('torch')}, {_measured_at(meta)}: "
        f"bf16, K = 4, cold L2, median of {meta.get('reps')} CUDA-graph replays (µs) of the whole call "
        "(allocation, ticket memset, kernels), timed with CUDA events. At every measured point the routed program is the "
        "fastest or within 3 % (and the interquartile spreads) of it; among those, the previous S's and the previous "
        "C's picks and then the default are preferred, so ties do not split bands. Bands run from one "
        "measured C to the next (the odd single-step bands are real: balanced channel tiles of some C leave part "
        "of a warp idle); variants not listed here were not measured and use the default. The table also keeps the package "
        "table's channel-first rules as they were (they are timed by `python -m conv1d_silu.bench --layout BCL`, not "
        "here). A run of named programs "
        "also re-times the program routed at each of its points. Timed but never routed "
        "(`Program.routed`, see conv1d_silu/routes.py for why): "
        + (", ".join(f"`{n}`" for n, p in routes.PROGRAMS.items() if not p.routed) or "none") + ".",
        "",
        "## Rules",
        "",
    ]
    for variant, rs in rules.items():
        out.append(
            f"* `{variant}`: "
            + (
                "; ".join(
                    f"`{r.program}` for {r.c_lo} <= C < {'inf' if r.c_hi >= routes.INF else r.c_hi}, S >= {r.s_min}"
                    for r in rs
                )
                or "default only"
            )
        )
    for variant in sorted({m.variant for m in ms}):
        programs = list(next(m for m in ms if m.variant == variant).times)
        out += ["", f"## {variant}", "", "| S | C | " + " | ".join(programs) + " | routed |", "|---" * (len(programs) + 3) + "|"]
        for m in sorted((m for m in ms if m.variant == variant), key=lambda m: (m.S, m.C)):
            default = routes.default_rule(variant).program
            routed = next((r.program for r in rules.get(variant, []) if r.matches(m.C, m.S, 4, "bfloat16")), default)
            best = min(m.times, key=m.times.get)
            cells = [f"**{m.times[p]:.1f}**" if p == best else f"{m.times[p]:.1f}" if p in m.times else ""
                     for p in programs]
            out.append(f"| {m.S} | {m.C} | " + " | ".join(cells) + f" | {routed} |")
    path.write_text("\n".join(out) + "\n")
    return path


def _dump_arch(dumps: list[dict]) -> str:
    """The one arch the dumps were measured on (``meta["arch"]``)."""
    archs = {d["meta"].get("arch") for d in dumps} - {None}
    if len(archs) != 1:
        raise SystemExit(f"--from-json: the dumps must name one arch in meta['arch'], got {sorted(archs) or 'none'}")
    return archs.pop()


def main(argv=None) -> None:
    from .bench import meta as bench_meta

    p = argparse.ArgumentParser(
        prog="python -m conv1d_silu.tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--variants", nargs="*", default=list(VARIANTS))
    p.add_argument("--C", type=int, nargs="*", default=DEFAULT_C)
    p.add_argument("--S", type=int, nargs="*", default=list(DEFAULT_S))
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--jobs", type=int, default=8, help="parallel NVRTC compiles before timing (0: compile lazily)")
    p.add_argument("--programs", nargs="*", help="time only these programs (default: every one)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="write <arch>.json and routes-<arch>.md here (default: ./tune-<arch>/)")
    p.add_argument("--write-package", action="store_true",
                   help="also write conv1d_silu/route_tables/<arch>.json (a writable source checkout only)")
    p.add_argument("--no-write", action="store_true", help="write neither file (only --json and the printout)")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="also dump the measurements here (with --from-json: the merged ones)")
    p.add_argument("--from-json", nargs="+", type=Path, metavar="FILE",
                   help="skip measuring: choose the routes from saved dumps "
                   "(merged: later files add programs, variants or shapes; time each (variant, C, S) in one run)")
    args = p.parse_args(argv)
    if args.no_write and (args.write_package or args.out):
        p.error("--no-write writes no table: leave out --out and --write-package")
    tables = package_tables() if args.write_package else None  # refuse before an hour of measuring
    if args.from_json:
        dumps = [json.loads(f.read_text()) for f in args.from_json]
        ms, meta = merge(dumps)
        # the parts' provenance, so a merged dump (e.g. of gpu-check tune-parts) says where each came from
        meta = {**meta, "parts": provenance(dumps)}
        arch = None if args.no_write else _dump_arch(dumps)
    else:
        # --programs of one direction: the other direction's variants have nothing to time
        args.variants = [v for v in args.variants if _programs(v, args.programs)]
        if args.jobs:
            precompile(args.variants, args.C, args.S, jobs=args.jobs, programs=args.programs)
        ms = measure(args.variants, args.C, args.S, args.reps, programs=args.programs)
        ns = argparse.Namespace(dtype="bf16", K=4, graph=False, reps=args.reps, layout="BLC")
        meta = bench_meta(torch.device("cuda"), ns, 0.0)
        # the device's own arch, not its route ('generic' where no table exists yet)
        meta["arch"] = arch = routes.arch_name(torch.cuda.get_device_capability())
        if args.programs:
            meta["programs"] = sorted({p for v in args.variants for p in _programs(v, args.programs)})
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "measurements": [m.__dict__ for m in ms]}))
    rules = choose(ms)
    for m in ms:
        print(m.variant, m.S, m.C, " ".join(f"{p}={t:.1f}" for p, t in m.times.items()))
    for variant, rs in rules.items():
        print(variant, [(r.program, r.c_lo, r.c_hi, r.s_min) for r in rs])
    if args.no_write:
        return
    out = args.out or Path(f"tune-{arch}")
    out.mkdir(parents=True, exist_ok=True)
    print(write_table(out / f"{arch}.json", arch, rules, meta))
    print(write_evidence(out / f"routes-{arch}.md", arch, ms, rules, meta))
    if tables is not None:
        print(write_table(tables / f"{arch}.json", arch, rules, meta))


if __name__ == "__main__":
    main()
