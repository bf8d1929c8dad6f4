"""Programs and the route table. Pure Python: testable without a GPU.

A *program* is a kernel entry point plus its launch geometry, for one memory layout of x:
channel-last (``"BLC"``, channels contiguous) or channel-first (``"BCL"``, the sequence contiguous).
A *route* maps (arch, variant) to an ordered list of rules; each rule names a program with a channel
band ``[c_lo, c_hi)``, a token floor ``s_min`` and optional dtype / K conditions. The first matching
rule whose program reads x's layout wins; every route ends in a default rule that matches
everything, and each layout has a default program of its own.

The rules are data: ``route_tables/<arch>.json`` (package data), one file per arch, written by
``python -m conv1d_silu.tune``; an arch without a file routes every call to the default programs.

All backward programs compute dweight/dbias with the same canonical reduction (see
``docs/kernel-design.md``), so a route changes speed, never bits.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import math
import re
from dataclasses import dataclass, replace

import torch

from .config import logger

INF = 1 << 62


@dataclass(frozen=True)
class Program:
    """One kernel entry point and its launch geometry."""

    name: str
    direction: str  # "fwd" or "bwd"
    description: str
    cuda: bool = True  # False: the PyTorch reference (any device)
    max_tile_vectors: int = 32  # channel vectors per tile (flat backward: columns); threads = cta_lanes * tile vectors
    rows_per_lane: int = 32  # forward: tokens one thread walks
    max_fill_rows: int = 0  # flat forward: lanes may grow to this many tokens so the grid fits one wave
    slabs_per_lane: int = 1  # backward: slabs one thread walks (1, 2, 4: CTA = 8 slabs; 8: CTA = 64 slabs)
    persistent: bool = False  # 1-D grid of a few CTAs per SM, each looping over work units
    vec_bytes: int = 16  # widest access per thread (8: half the registers, twice the threads)
    tile_align_bytes: int = 0  # channel tiles start on multiples of this many bytes (0: balanced tiles)
    routed: bool = True  # False: forced by name and timed by the tuner, but never picked by a route
    # CTAs laid flat over the row-major (lane or node, vector) pairs, so no thread idles at any C:
    # the forward's 256-thread CTAs cover whole rows; the backward's cover max_tile_vectors
    # (node, vector) columns of cta_lanes lanes each, one ticket per column
    flat: bool = False
    layout: str = "BLC"  # the memory layout of x it reads in place (another is copied to it first)
    chain: int = 0  # channel-first backward: vectors per lane of the chained round (0: the staged round)

    @property
    def cta_level(self) -> int:
        """Backward: the tree level of the nodes a CTA makes (1: lanes of 1, 2 or 4 slabs; 2: of LANES)."""
        return 2 if self.slabs_per_lane == LANES else 1

    @property
    def cta_lanes(self) -> int:
        """Backward: thread rows per CTA (the CTA's LANES slabs, or LANES level-1 nodes, split among them)."""
        return LANES // self.slabs_per_lane if self.cta_level == 1 else LANES


LANES = 8  # a tree node's children (slabs or level-1 nodes): a backward CTA column's slots; the forward's thread rows


PROGRAMS: dict[str, Program] = {
    p.name: p
    for p in (
        Program("reference", "any", "PyTorch reference (CPU and GPU; float64-capable)", cuda=False),
        Program("fwd_rows", "fwd", "forward: each thread walks 32 tokens of one channel vector"),
        # Its 256-row CTAs run 10-11 % slower when the output lands in memory mapped right after a
        # large free (H200, 65536 to 1M tokens); the 128-row fwd_rows16_8b has no such mode.
        Program("fwd_rows_8b", "fwd", "forward with 8-byte accesses (twice the threads)", vec_bytes=8, routed=False),
        Program(
            "fwd_rows16_8b",
            "fwd",
            "forward, 8-byte accesses, 16 tokens per thread: more threads for short sequences",
            rows_per_lane=16,
            vec_bytes=8,
        ),
        # Rows of 392 channels in tiles of 20-28 vectors leave 8-12 % of the threads idle and cost
        # 24 % more than 384 at a million tokens on the H200; laid flat they cost 8 % more.
        Program(
            "fwd_flat16_8b",
            "fwd",
            "forward, 8-byte accesses, 16 tokens per thread (up to 26 where that saves a second wave), 256 "
            "threads laid flat over whole rows: no idle thread at any C",
            rows_per_lane=16,
            max_fill_rows=26,  # one wave up to C = 424 at 32768 tokens on 132 SMs
            vec_bytes=8,
            flat=True,
        ),
        Program("rowgroup", "bwd", "row groups of 8 slabs x channel tiles, one CTA per group"),
        Program(
            "rowgroup_8b",
            "bwd",
            "row groups of 8 slabs, 8-byte accesses, channel tiles of 16 vectors (128 threads): half the "
            "registers per thread, four CTAs per SM",
            max_tile_vectors=16,
            vec_bytes=8,
        ),
        Program(
            "rowgroup_long",
            "bwd",
            "row groups of 64 slabs (8 per thread) x channel tiles, one CTA per group",
            slabs_per_lane=8,
        ),
        Program(
            "rowgroup_long_8b",
            "bwd",
            "row groups of 64 slabs (8 per thread), 8-byte accesses: short halos and more warps per SM",
            slabs_per_lane=8,
            vec_bytes=8,
        ),
        # At 131072 x 384 its 384 CTAs of 128 threads spread ~3 per SM over all 132 SMs, where 192
        # CTAs of 256 threads leave 72 SMs with one.
        Program(
            "rowgroup_long16_8b",
            "bwd",
            "row groups of 64 slabs (8 per thread), 8-byte accesses, channel tiles of 16 vectors (128 threads): "
            "a partial wave spreads over every SM",
            max_tile_vectors=16,
            slabs_per_lane=8,
            vec_bytes=8,
        ),
        Program(
            "rowgroup_flat_8b",
            "bwd",
            "row groups of 8 slabs, 8-byte accesses, 16 (node, vector) columns per CTA laid flat over the rows: "
            "no idle thread at any C",
            max_tile_vectors=16,
            vec_bytes=8,
            flat=True,
        ),
        # Lanes of 2 slabs: the once-per-lane work (window, weights, plans, the K-1 tail tokens) spread
        # over twice the rows, at half the threads: 4-7 % ahead of one-slab lanes at 32768-131072
        # tokens on the H200. Lanes of 4 slabs are 2.3-6 % behind the best program at every shape
        # measured on the H100, so no program has them.
        Program(
            "rowgroup2_8b",
            "bwd",
            "row groups of 8 slabs (2 per thread), 8-byte accesses, channel tiles of 32 vectors (128 threads)",
            slabs_per_lane=2,
            vec_bytes=8,
        ),
        Program(
            "rowgroup_flat2_8b",
            "bwd",
            "row groups of 8 slabs (2 per thread), 8-byte accesses, 32 (node, vector) columns per CTA laid flat "
            "over the rows (128 threads)",
            slabs_per_lane=2,
            vec_bytes=8,
            flat=True,
        ),
        Program(
            "rowgroup_long_flat_8b",
            "bwd",
            "row groups of 64 slabs (8 per thread), 8-byte accesses, 16 (node, vector) columns per CTA laid flat "
            "over the rows",
            max_tile_vectors=16,
            slabs_per_lane=8,
            vec_bytes=8,
            flat=True,
        ),
        # With eight-slab walks, 16-column CTAs (a boundary every 128 bytes of each row) read 22 % more
        # from DRAM and take 1.33x the time of 32-column ones at 1M x 264 on the H200; where CTAs are
        # scarce (65536-131072 tokens) the 16-column program still wins, so the tuner picks.
        Program(
            "rowgroup_long_flat32_8b",
            "bwd",
            "row groups of 64 slabs (8 per thread), 8-byte accesses, 32 (node, vector) columns per CTA laid flat "
            "over the rows (256 threads): half the CTA boundaries",
            slabs_per_lane=8,
            vec_bytes=8,
            flat=True,
        ),
        # With 16-byte copies through the L1 this program is 1-12 % faster than the 8-byte flat32 one
        # at ragged C from 262144 tokens on the H100, at half the warps per SM.
        Program(
            "rowgroup_long_flat32",
            "bwd",
            "row groups of 64 slabs (8 per thread), 16-byte accesses, 32 (node, vector) columns per CTA laid flat "
            "over the rows (256 threads): fewer L2 requests per row at ragged C",
            slabs_per_lane=8,
            flat=True,
        ),
        # Channel-first x ((B, C, L), the sequence contiguous: causal-conv1d's layout, and mamba_ssm's
        # chunks of its in-projection) in place.
        Program(
            "fwd_bcl",
            "fwd",
            "channel-first forward: each thread computes 2 vectors of up to 8 tokens of one channel",
            layout="BCL",
        ),
        Program(
            "bwd_bcl",
            "bwd",
            "channel-first backward: each thread walks one slab of one channel, from a round of up to 256 "
            "slabs staged in shared memory with coalesced loads, and stores its own dx; CTAs fold the rounds. "
            "Where no document starts inside a slab and there are no states, a walk without document rings",
            layout="BCL",
        ),
        # No staging: each lane loads two consecutive vectors a step (a warp's 16-byte loads and stores
        # at a 32-byte stride), computes g and dx in registers, and chains its slab's partial through
        # the slab's lanes by shuffles. At bf16 it takes 0.90-0.98x the staged walk's time at 16384
        # tokens and C of 1024 to 5120, 0.97x at 32768 x 1024, and 1.01-1.06x at 32768 tokens and C >=
        # 2560 and at 65536 and C >= 1024 (H100), running 8 % more instructions a round (static SASS).
        Program(
            "bwd_bcl_chain2",
            "bwd",
            "channel-first backward without staging: each lane computes g and dx of two vectors a step from "
            "its own loads, and a slab's partial is chained through its lanes (bwd_bcl's staged round where "
            "documents start inside slabs, states are given or a vector cannot hold a token's taps)",
            layout="BCL",
            chain=2,
        ),
        Program(
            "rowgroup_sm",
            "bwd",
            "SM-wide: persistent 1-D grid (CTAs per SM), 256 threads, each CTA walking groups of 8 slabs",
            persistent=True,
        ),
        Program(
            "rowgroup_sm_long",
            "bwd",
            "SM-wide: persistent 1-D grid, 256 threads, groups of 64 slabs (8 per thread)",
            persistent=True,
            slabs_per_lane=8,
        ),
    )
}

# The 8-byte programs with channel tiles on 32 / 64 / 128-byte boundaries: an aligned tile as wide
# as a balanced one that starts mid-sector is up to 25 % faster (fwd_rows_8b at C = 272,
# rowgroup_long_8b at 320, on the H200), but the aligned width that wins depends on the program, C
# and S (16-vector forward tiles lose 20 % at C = 408), so the tuner picks among them per band.
ALIGNED_TILES = {
    "fwd_rows_8b": (32, 64), "fwd_rows16_8b": (32, 64), "rowgroup_8b": (32, 128), "rowgroup_long_8b": (32, 64),
    "rowgroup2_8b": (128,),
}
PROGRAMS.update(
    (f"{base}_a{a}", replace(
        PROGRAMS[base], name=f"{base}_a{a}", tile_align_bytes=a,
        description=f"{PROGRAMS[base].description}; channel tiles on {a}-byte boundaries",
    ))
    for base, aligns in ALIGNED_TILES.items() for a in aligns
)

VARIANTS = ("fwd", "fwd_bias", "fwd_dt", "bwd", "bwd_bias", "bwd_dt", "bwd_fp32g", "bwd_bias_fp32g")
ARCHS = ("sm_90", "sm_100a", "sm_103a", "sm_107a")  # archs whose routes are chosen: measured or by rule
ARCH_NAME = re.compile(r"sm_\d+a?")


def variant_name(direction: str, bias: bool, documents: bool, fp32_grads: bool = False) -> str:
    """The route variant of a call. A document table names the variant (``*_dt``), then
    fp32 weight grads (``bwd*_fp32g``), then bias; every combination runs, this only routes it."""
    if documents:
        return f"{direction}_dt"
    if direction == "bwd" and fp32_grads:
        return "bwd_bias_fp32g" if bias else "bwd_fp32g"
    return f"{direction}_bias" if bias else direction


@dataclass(frozen=True)
class Rule:
    """Use ``program`` for c_lo <= C < c_hi and S >= s_min (and the dtype / K sets when given)."""

    program: str
    c_lo: int = 0
    c_hi: int = INF
    s_min: int = 0
    dtypes: frozenset[str] | None = None  # x dtype names, e.g. {"bfloat16"}
    ks: frozenset[int] | None = None

    def matches(self, C: int, S: int, K: int, dtype: str) -> bool:
        return (
            self.c_lo <= C < self.c_hi
            and S >= self.s_min
            and (self.dtypes is None or dtype in self.dtypes)
            and (self.ks is None or K in self.ks)
        )

    @property
    def is_default(self) -> bool:
        return (self.c_lo, self.c_hi, self.s_min, self.dtypes, self.ks) == (0, INF, 0, None, None)

    @property
    def catches_all(self) -> bool:
        """Whether it is a route's default: it matches every call, and channel-last calls read its
        program (a channel-first call falls back to its layout's default, not to it)."""
        return self.is_default and PROGRAMS[self.program].layout == "BLC"

    @property
    def condition(self) -> str:
        """Where the rule applies, in words (``"264 <= C < 296, S >= 32768"``; ``"every call"``)."""
        parts = []
        if (self.c_lo, self.c_hi) != (0, INF):
            parts.append(f"{self.c_lo} <= C" + (f" < {self.c_hi}" if self.c_hi < INF else ""))
        if self.s_min:
            parts.append(f"S >= {self.s_min}")
        if self.dtypes is not None:
            parts.append(f"dtype in {sorted(self.dtypes)}")
        if self.ks is not None:
            parts.append(f"K in {sorted(self.ks)}")
        return ", ".join(parts) or "every call"


FWD_DEFAULT = Rule("fwd_rows")
BWD_DEFAULT = Rule("rowgroup")
LAYOUT_DEFAULTS = {"BCL": {"fwd": Rule("fwd_bcl"), "bwd": Rule("bwd_bcl")}}  # layouts other than BLC


def default_rule(variant: str) -> Rule:
    return FWD_DEFAULT if variant.startswith("fwd") else BWD_DEFAULT


class RouteTableError(ValueError):
    """A route table file that does not parse as one (the message names the file and the entry)."""


_RULE_KEYS = {"program", "c_lo", "c_hi", "s_min", "dtypes", "ks"}
_DTYPES = ("bfloat16", "float16", "float32", "float64")


def _rule(raw, where: str, direction: str, fail) -> Rule:
    if not isinstance(raw, dict):
        fail(f"{where}: expected an object, got {raw!r}")
    if "program" not in raw:
        fail(f"{where}: no 'program'")
    if set(raw) - _RULE_KEYS:
        fail(f"{where}: unknown keys {sorted(set(raw) - _RULE_KEYS)} (expected some of {sorted(_RULE_KEYS)})")
    name = raw["program"]
    program = PROGRAMS.get(name) if isinstance(name, str) else None
    if program is None:
        fail(f"{where}: unknown program {name!r}")
    if program.direction != direction:
        fail(f"{where}: {name!r} is a {program.direction} program, in a {direction} route")
    if not program.routed:
        fail(f"{where}: {name!r} is never routed (Program.routed is False)")

    def count(key: str, default: int | None) -> int:
        value = raw.get(key, default)
        if value is None and key == "c_hi":
            return INF  # no upper bound
        if type(value) is not int or value < 0:
            fail(f"{where}: {key} must be a non-negative integer{' or null' if key == 'c_hi' else ''}, got {value!r}")
        return value

    c_lo, c_hi, s_min = count("c_lo", 0), count("c_hi", None), count("s_min", 0)
    if c_lo >= c_hi:
        fail(f"{where}: empty channel band c_lo = {c_lo} >= c_hi = {c_hi}")
    dtypes, ks = raw.get("dtypes"), raw.get("ks")
    if dtypes is not None and (not isinstance(dtypes, list) or not dtypes or any(d not in _DTYPES for d in dtypes)):
        fail(f"{where}: dtypes must be a non-empty list of {_DTYPES}, got {dtypes!r}")
    if ks is not None and (not isinstance(ks, list) or not ks or any(type(k) is not int or k < 1 for k in ks)):
        fail(f"{where}: ks must be a non-empty list of positive integers, got {ks!r}")
    return Rule(
        name, c_lo, c_hi, s_min,
        None if dtypes is None else frozenset(dtypes),
        None if ks is None else frozenset(ks),
    )


def parse_table(data, source: str) -> tuple[str, dict[str, tuple[Rule, ...]]]:
    """The arch and its routes (variant -> ordered rules, each ending in a default) from a route
    table's JSON data; variants the table does not list get the default alone.

    Raises RouteTableError, naming ``source``, for anything but a well-formed table."""

    def fail(message: str):
        raise RouteTableError(f"route table {source}: {message}")

    if not isinstance(data, dict) or set(data) != {"arch", "measured", "routes"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        fail(f"expected an object with the keys ['arch', 'measured', 'routes'], got {keys}")
    arch, measured, table = data["arch"], data["measured"], data["routes"]
    if not isinstance(arch, str) or not ARCH_NAME.fullmatch(arch):
        fail(f"arch {arch!r} is not a CUDA arch name like 'sm_90' or 'sm_100a'")
    if not isinstance(measured, dict):
        fail(f"'measured' must be an object (GPU, tool, dtype, K, dates), got {measured!r}")
    if not isinstance(table, dict):
        fail(f"'routes' must be an object of variant -> rules, got {table!r}")
    routes = {v: (default_rule(v),) for v in VARIANTS}
    for variant, raw_rules in table.items():
        if variant not in VARIANTS:
            fail(f"unknown variant {variant!r} (expected one of {VARIANTS})")
        if not isinstance(raw_rules, list) or not raw_rules:
            fail(f"routes.{variant}: expected a non-empty list of rules")
        rules = tuple(
            _rule(raw, f"routes.{variant}[{i}]", variant[:3], fail) for i, raw in enumerate(raw_rules)
        )
        # channel-first calls fall back to their layout's default: only a channel-last rule catches all
        catch_all = [i for i, r in enumerate(rules) if r.catches_all]
        if not catch_all:
            fail(f"routes.{variant}: no default: the last rule must match every call (only 'program')")
        if catch_all[0] != len(rules) - 1:
            fail(f"routes.{variant}[{catch_all[0]}] matches every call, so the rules after it never apply")
        routes[variant] = rules
    return arch, routes


def format_table(arch: str, measured: dict, routes: dict[str, list[Rule]]) -> str:
    """A route table as JSON, one rule per line; each listed variant's rules get the default appended
    unless they end in a channel-last one (the format ``parse_table`` reads)."""

    def rule(r: Rule) -> str:
        if r.is_default:
            return json.dumps({"program": r.program})
        d = {"program": r.program, "c_lo": r.c_lo, "c_hi": None if r.c_hi >= INF else r.c_hi, "s_min": r.s_min}
        if r.dtypes is not None:
            d["dtypes"] = sorted(r.dtypes)
        if r.ks is not None:
            d["ks"] = sorted(r.ks)
        return json.dumps(d)

    blocks = []
    for variant in sorted(routes, key=VARIANTS.index):
        rules = list(routes[variant])
        if not rules or not rules[-1].catches_all:
            rules.append(default_rule(variant))
        lines = ",\n".join(f"      {rule(r)}" for r in rules)
        blocks.append(f"    {json.dumps(variant)}: [\n{lines}\n    ]")
    routes_text = "{\n" + ",\n".join(blocks) + "\n  }" if blocks else "{}"
    return (
        f'{{\n  "arch": {json.dumps(arch)},\n  "measured": {json.dumps(measured)},\n'
        f'  "routes": {routes_text}\n}}\n'
    )


def load_table(path) -> tuple[str, dict[str, tuple[Rule, ...]]]:
    """``parse_table`` of a file (a path or an ``importlib.resources`` entry) named ``<arch>.json``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise RouteTableError(f"route table {path}: not JSON: {err}") from None
    arch, routes = parse_table(data, str(path))
    if path.name != f"{arch}.json":
        raise RouteTableError(f"route table {path}: holds the routes of {arch!r}; name it {arch}.json")
    return arch, routes


def route_table(directory=None) -> dict[str, dict[str, tuple[Rule, ...]]]:
    """arch -> variant -> ordered rules (each ending in a default), from the ``<arch>.json`` files of
    ``directory`` (default: the package's ``route_tables``); archs without a file, and 'generic',
    get the defaults alone."""
    if directory is None:
        directory = importlib.resources.files(__package__) / "route_tables"
    table = {arch: {v: (default_rule(v),) for v in VARIANTS} for arch in (*ARCHS, "generic")}
    for entry in sorted(directory.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            arch, routes = load_table(entry)
            table[arch] = routes
    return table


ROUTES = route_table()


def arch_name(capability: tuple[int, int]) -> str:
    """The CUDA arch name of a compute capability: sm_90 below 10.0, sm_100a and up from there."""
    major, minor = capability
    return f"sm_{major}{minor}" if major < 10 else f"sm_{major}{minor}a"


def arch_of(capability: tuple[int, int]) -> str:
    """Route-table arch of a CUDA compute capability. An arch without a table (sm_80, sm_86, sm_89,
    sm_120, ...) maps to 'generic', the default programs, with a warning once: they are correct
    everywhere but were measured on none of those GPUs."""
    name = arch_name(capability)
    if name in ROUTES:
        return name
    _warn_unmeasured(name)
    return "generic"


@functools.cache
def _warn_unmeasured(arch: str) -> None:
    logger.warning(
        "conv1d_silu: no measured route table for %s; the default programs run there (correct, not tuned). "
        "`python -m conv1d_silu.tune --out DIR` measures one on this GPU.", arch
    )


@functools.lru_cache(maxsize=16384)
def rule_for(
    arch: str, variant: str, C: int, S: int, K: int = 4, dtype: str = "bfloat16", layout: str = "BLC"
) -> Rule:
    """The first rule of the route that matches, among those of x's layout (cached: calls repeat
    the same shapes)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
    if arch not in ROUTES:
        _warn_unmeasured(arch)
        arch = "generic"
    for rule in ROUTES[arch][variant]:
        if PROGRAMS[rule.program].layout == layout and rule.matches(C, S, K, dtype):
            return rule
    if layout in LAYOUT_DEFAULTS:
        return LAYOUT_DEFAULTS[layout][variant[:3]]
    raise AssertionError(f"route {arch}/{variant} has no default")  # pragma: no cover


def select(
    arch: str, variant: str, C: int, S: int, K: int = 4, dtype: str = "bfloat16", layout: str = "BLC"
) -> Program:
    """The program that runs ``variant`` on ``arch`` for C channels and S tokens of x in ``layout``."""
    return PROGRAMS[rule_for(arch, variant, C, S, K, dtype, layout).program]


@functools.cache
def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def forced(name: str | None, direction: str, on_cuda: bool) -> Program | None:
    """The program forced by name for this direction (None: not forced or forced for the other one).

    Raises ValueError for unknown names and for CUDA programs on CPU tensors.
    """
    if name is None:
        return None
    program = PROGRAMS.get(name)
    if program is None:
        raise ValueError(f"program: expected one of {sorted(PROGRAMS)}, got {name!r}")
    if program.cuda and not on_cuda:
        raise ValueError(f"program: {name!r} runs on CUDA tensors only, got tensors on the CPU")
    if program.direction not in (direction, "any"):
        return None
    return program


def tile_vectors(n_vectors: int, cap: int, align: int = 1) -> int:
    """Channel tile width in vectors, at most ``cap``.

    ``align == 1``: the fewest tiles, split evenly. Otherwise the width is a multiple of ``align``
    (every tile then starts on an aligned byte offset within the row) between half the cap and the
    row's own rounded width, the one that leaves the fewest idle thread slots (ties: the widest).
    """
    if align <= 1:
        tiles = max(1, math.ceil(n_vectors / cap))
        return math.ceil(n_vectors / tiles)
    top = min(cap, -(-n_vectors // align) * align)
    widths = range(max(align, min(top, cap // 2 // align * align)), top + 1, align)
    return min(widths, key=lambda t: (math.ceil(n_vectors / t) * t, -t), default=top)
