"""The bench's results as reports: ``--from-json`` parts merged, ``--peers`` joined, the markdown
tables and the plot (conv1d_silu.bench measures; this reads what it saved, without a GPU)."""

from __future__ import annotations

import json
import os

CALLS = ("fwd", "bwd", "fwdbwd")
SAME_BYTES = {"fwd": "copy", "bwd": "add"}  # PyTorch's own kernel moving the bytes a call moves
PLAIN = ("torch_copy", "torch_add")  # the rows of those kernels: the floor ours is held to
PEERS = ("dao_cc1d", "dao_cc1d_det", "fla_triton")  # the peers' implementations, timed for host overhead too


# What the parts of one bench must share to be reported as one table.
SAME_IN_PARTS = ("gpu", "torch", "cupy", "commit", "dtype", "K", "graph", "reps", "layout")


def merge_results(parts: list[dict]) -> dict:
    """One result from the saved results of several runs (``--part``s, or a run cut short and the
    rest): rows and speedups of every part ordered by (S, C), a later part's row replacing an earlier
    one of the same (S, C, call, implementation); meta of the first, each part's meta under
    ``parts``, and the first host overhead measured. Parts must agree on GPU, versions, commit,
    dtype, K and timing mode."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]["meta"]
    for i, part in enumerate(parts[1:], 2):
        diff = [k for k in SAME_IN_PARTS if _meta_value(part["meta"], k) != _meta_value(first, k)]
        if diff:
            raise ValueError(f"--from-json: part {i} differs from part 1 in {', '.join(diff)}")
    rows: dict[tuple, dict] = {}
    speedups: dict[tuple, dict] = {}
    for part in parts:
        rows.update({(r["S"], r["C"], r["call"], r["impl"]): r for r in part["rows"]})
        speedups.update({(r["S"], r["C"], r["call"], r["baseline"]): r for r in part["speedups"]})
    host = next((p["host_overhead_us"] for p in parts if p.get("host_overhead_us")), None)
    by_shape = lambda r: (r["S"], r["C"])  # noqa: E731  (stable: a shape's rows keep their order)
    return {"meta": {**first, "parts": [p["meta"] for p in parts]}, "host_overhead_us": host,
            "rows": sorted(rows.values(), key=by_shape), "speedups": sorted(speedups.values(), key=by_shape)}


def _meta_value(meta: dict, key: str):
    """A run's setting; runs saved before ``layout`` was recorded were token-major."""
    return meta.get(key, "BLC" if key == "layout" else None)


# What a peer run must share with the result it joins: what its rows measured must be comparable.
SAME_FOR_PEERS = ("gpu", "dtype", "K", "graph", "layout")


def add_peers(result: dict, peers: list[dict]) -> dict:
    """``result`` with the peer rows of other runs on the same GPU, dtype, K and timing mode: every
    implementation but ours and PyTorch's copy / add (``PLAIN``), where ``result`` has no row of the
    same (S, C, call, implementation). Each added row names its run (``peer``: an index into
    ``meta["peers"]``), and gets a speedup against ours of ``result`` at the same (S, C, call):
    without a CI (saved rows keep no reps, and a CI within one run says nothing of the drift
    between two), with the peer run's own same-run speedup and CI under ``peer_run``."""
    if not peers:
        return result
    key = lambda r: (r["S"], r["C"], r["call"], r["impl"])
    rows, speedups = list(result["rows"]), list(result["speedups"])
    have = {key(r) for r in rows}
    ours = {(r["S"], r["C"], r["call"]): r for r in rows if r["impl"] == "conv1d_silu"}
    metas = list(result["meta"].get("peers", []))
    for i, peer in enumerate(peers, 1):
        diff = [k for k in SAME_FOR_PEERS if _meta_value(peer["meta"], k) != _meta_value(result["meta"], k)]
        if diff:
            raise ValueError(f"--peers: peer {i} differs from the result in {', '.join(diff)}")
        own = {(s["S"], s["C"], s["call"], s["baseline"]): s for s in peer["speedups"]}
        added = [r for r in peer["rows"] if r["impl"] not in ("conv1d_silu", "bare", *PLAIN) and key(r) not in have]
        for r in added:
            have.add(key(r))
            rows.append({**r, "peer": len(metas)})
            o = ours.get((r["S"], r["C"], r["call"]))
            if o is None or r["call"] not in CALLS:
                continue
            same = own.get(key(r))
            speedups.append({
                "S": r["S"], "C": r["C"], "call": r["call"], "baseline": r["impl"], "baseline_us": r["median_us"],
                "ours_us": o["median_us"], "speedup": r["median_us"] / o["median_us"], "ci95": None,
                "pct_copy_bw": o["pct_copy_bw"],
                "peer_run": same and {k: same[k] for k in ("ours_us", "speedup", "ci95")},
            })
        metas.append({**{k: v for k, v in peer["meta"].items() if k not in ("parts", "peers")},
                      "impls": sorted({r["impl"] for r in added})})
    by_shape = lambda r: (r["S"], r["C"])
    return {**result, "meta": {**result["meta"], "peers": metas},
            "rows": sorted(rows, key=by_shape), "speedups": sorted(speedups, key=by_shape)}


def write_json(result: dict, path: str) -> None:
    """``result`` to ``path`` whole or not at all (a run killed while writing keeps the last file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)


BASELINE_ORDER = ("torch_eager", "torch_compile", "dao_cc1d", "dao_cc1d_det", "fla_triton")


def _copy_or_add(rows: list[dict]) -> dict[tuple, dict]:
    """PyTorch's copy_ / add row of each (S, C), keyed by the call it is the floor of."""
    return {(r["S"], r["C"], call): r for r in rows for call, ref in SAME_BYTES.items() if r["impl"] == "torch_" + ref}


def _timing(m: dict) -> str:
    if m["gpu"] == "cpu":
        return "wall clock on the CPU"
    return f"{'CUDA graph replays' if m['graph'] else 'eager calls'}, cold L2"


def _speedup_cell(s: dict) -> str:
    if s.get("ci95"):
        return f"{s['baseline_us']:.1f}: {s['speedup']:.2f}x ({s['ci95'][0]:.2f}-{s['ci95'][1]:.2f})"
    own = s.get("peer_run")
    same = f" (same run {own['speedup']:.2f}x, {own['ci95'][0]:.2f}-{own['ci95'][1]:.2f})" if own else ""
    return f"{s['baseline_us']:.1f}: {s['speedup']:.2f}x{same}"


def markdown(result: dict) -> str:
    m = result["meta"]
    floor = _copy_or_add(result["rows"])
    bare = {(r["S"], r["C"], r["call"]): r for r in result["rows"] if r["impl"] == "bare"}
    layout = ", x channel-first (B, C, L), S = B x L" if m.get("layout") == "BCL" else ""
    lines = [
        (f"GPU {m['gpu']}, torch {m['torch']}, commit {m['commit'][:10] or 'unknown'}, {m['dtype']} K={m['K']}{layout}, "
         f"copy {m['copy_bandwidth_TBps']:.2f} TB/s, {_timing(m)}, {m.get('reps', '?')} reps per row"),
        "",
        ("µs are medians. copy_ / add: PyTorch's pass over the same bytes (`copy_` for the forward: reads x, "
         "writes y; `add` for the backward: reads x and dy, writes dx), timed in alternation with ours within "
         "every rep; ratio: ours / that, a same-run ratio. % copy BW: the call's bytes per second against the "
         "copy bandwidth of the same run. det: five forward + backward calls give the same bits.")
        + (" bare: our program's loads and stores without its math and fold (--floor), timed in the same "
           "turns; bare ratio: it / copy_ or add." if bare else ""),
        "",
        "| S | C | call | ours µs | copy_ / add µs | ratio | % copy BW | det |" + (" bare µs | bare ratio |" if bare else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|---|" if bare else ""),
    ]
    for r in result["rows"]:
        if r["impl"] != "conv1d_silu":
            continue
        key = (r["S"], r["C"], r["call"])
        ref = floor.get(key)
        ref_us = f"{ref['median_us']:.1f}" if ref and r["same_run_ratio"] else ""
        ratio = f"{r['same_run_ratio']:.2f}x" if r["same_run_ratio"] else ""
        det = {True: "yes", False: "NO", None: ""}[r["deterministic"]]
        line = (f"| {r['S']} | {r['C']} | {r['call']} | {r['median_us']:.1f} | {ref_us} | {ratio} | "
                f"{r['pct_copy_bw']:.0f} | {det} |")
        if bare:
            f = bare.get(key)
            line += f" {f['median_us']:.1f} | {f['same_run_ratio']:.2f}x |" if f else "  |  |"
        lines.append(line)
    if result["speedups"]:
        lines += _speedup_table(result)
    if result.get("host_overhead_us"):
        h = result["host_overhead_us"]
        peers = "".join(f", {p} {h[p + '_fwd_bwd']:.0f}" for p in PEERS if p + "_fwd_bwd" in h)
        lines += ["", f"Host overhead (CPU µs per eager fwd+bwd, 64x64): ours {h['conv1d_silu_fwd_bwd']:.0f}, "
                      f"torch (x*2).sum().backward() {h['torch_x2_sum_backward']:.0f}, ratio {h['ratio']:.2f}{peers}"]
    return "\n".join(lines)


def _speedup_table(result: dict) -> list[str]:
    """One line per (S, C, call), one column per baseline: its µs and its median over ours."""
    named = {s["baseline"] for s in result["speedups"]}
    baselines = [b for b in BASELINE_ORDER if b in named] + sorted(named - set(BASELINE_ORDER))
    cells: dict[tuple, dict[str, str]] = {}
    ours_us: dict[tuple, float] = {}
    for s in result["speedups"]:
        key = (s["S"], s["C"], s["call"])
        cells.setdefault(key, {})[s["baseline"]] = _speedup_cell(s)
        ours_us[key] = s["ours_us"]
    lines = ["", "Speedups: each baseline's µs and its median / ours, with the 95 % bootstrap CI over the reps."]
    for p in result["meta"].get("peers", []):
        if p.get("impls"):
            lines.append(f"{', '.join(p['impls'])}: rows of another run on this GPU (commit {p['commit'][:10]}, "
                         f"{p.get('date', '')}), against ours of this run: no CI across runs; in brackets that "
                         f"run's speedup over its own ours, with its CI.")
    lines += ["", f"| S | C | call | ours µs | {' | '.join('vs ' + b for b in baselines)} |",
              "|---" * (4 + len(baselines)) + "|"]
    for (S, C, call), row in cells.items():
        lines.append(f"| {S} | {C} | {call} | {ours_us[(S, C, call)]:.1f} | "
                     + " | ".join(row.get(b, "") for b in baselines) + " |")
    return lines


# What the plot draws per panel: label, colour, marker, line style. The eager and compiled baselines
# (10-40x ours) stay in the tables: on the same axes they would flatten every other line.
PLOT_LINES = {
    "conv1d_silu": ("conv1d_silu (ours)", "tab:blue", "o", "-"),
    "dao_cc1d": ("causal-conv1d", "tab:orange", "s", "-"),
    "dao_cc1d_det": ("causal-conv1d, deterministic", "tab:red", "D", "-"),
    "fla_triton": ("flash-linear-attention", "tab:green", "^", "-"),
    "floor": ("PyTorch copy_ (fwd) / add (bwd) of the same shape", "0.35", "", "--"),
}


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Round values between lo and hi for a log axis: the coarsest of the 1-2-5 steps that gives at
    least three (matplotlib's own log ticks leave a span under a decade with one label or none)."""
    import math

    for steps in ((1,), (1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.4, 1.6, 1.8, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 9)):
        ticks = [m * 10**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1) for m in steps]
        ticks = [t for t in ticks if lo <= t <= hi]
        if len(ticks) >= 3:
            return ticks
    return ticks


def figure(result: dict):
    """µs against channels C: one row of panels per token count, forward and backward side by side,
    ours beside the peers and PyTorch's copy_ / add of the same shape (the floor: the same bytes
    moved by PyTorch's own kernel). Log µs, so the gap between two lines reads as their ratio at
    every height; one legend for every panel."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    rows = result["rows"]
    tokens = sorted({r["S"] for r in rows if r["impl"] == "conv1d_silu" and r["call"] in SAME_BYTES})
    from_peers = {r["impl"] for r in rows if "peer" in r}
    fig = Figure(figsize=(9, 1.3 + 2.0 * max(1, len(tokens))), layout="constrained")
    axes = fig.subplots(max(1, len(tokens)), 2, squeeze=False)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for i, S in enumerate(tokens):
        cs = sorted({r["C"] for r in rows if r["S"] == S})
        for j, call in enumerate(SAME_BYTES):
            ax = axes[i][j]
            for impl, (label, colour, marker, style) in PLOT_LINES.items():
                want = ("torch_" + SAME_BYTES[call], SAME_BYTES[call]) if impl == "floor" else (impl, call)
                pts = sorted((r["C"], r["median_us"]) for r in rows if r["S"] == S and (r["impl"], r["call"]) == want)
                if pts:
                    label += " (another run)" if impl in from_peers else ""
                    ax.plot(*zip(*pts), color=colour, marker=marker, ls=style, ms=4, lw=1.4, label=label)
            if cs[-1] / cs[0] > 4:  # a million tokens: C from 64 to 4096, in powers of two
                ax.set_xscale("log", base=2)
                ax.xaxis.set_major_locator(FixedLocator(cs))
            else:
                ax.xaxis.set_major_locator(FixedLocator(cs[::3]))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(plain)
            ax.set_yscale("log")
            ax.margins(y=0.1)  # room for a peer's point above ours, clear of the panel's title
            ax.yaxis.set_major_locator(FixedLocator(_log_ticks(*ax.get_ylim())))
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_locator(NullLocator())
            ax.tick_params(labelsize=7, which="both")
            ax.grid(alpha=0.3)
            ax.set_title(f"{'forward' if call == 'fwd' else 'backward'}, S = {S:,} tokens", fontsize=9)
            ax.set_ylabel("µs" if j == 0 else "", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("channels C", fontsize=8)
    handles = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    m = result["meta"]
    fig.suptitle(f"{m['gpu']}, {m['dtype']}, K = {m['K']}: µs per call (median; {_timing(m)})", fontsize=11)
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    return fig


def plot(result: dict, path: str):
    """Draw ``figure(result)`` into the PNG ``path``; returns the figure."""
    fig = figure(result)
    fig.savefig(path, dpi=100)
    return fig
