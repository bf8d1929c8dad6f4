"""The benchmark's baselines, CLI, reports and plot, on the CPU fallback and the committed results."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import DEVICES

from conv1d_silu import bench, bench_report, ops
from conv1d_silu.documents import doc_table
from conv1d_silu.reference import forward as reference_forward


@pytest.mark.parametrize("bias", [False, True])
def test_baselines_compute_the_op(bias):
    x = torch.randn(50, 12, dtype=torch.float64)
    w = torch.randn(12, 4, dtype=torch.float64)
    b = torch.randn(12, dtype=torch.float64) if bias else None
    want, _ = reference_forward(x, w, b, doc_table(x, None, None, None), None, False, True)
    torch.testing.assert_close(bench.torch_reference(x, w, b), want)
    torch.testing.assert_close(bench.torch_reference_shifts(x, w, b), want)


@pytest.mark.skipif(shutil.which("c++") is None, reason="Inductor needs a C++ compiler on the CPU")
@pytest.mark.timeout(600)
def test_compiled_baseline_builds_one_graph_for_every_shape():
    # Inductor specialises F.conv1d's groups=C (one graph per C: the recompile storm the bench's
    # first compiled baseline had); the shifted form stays one dynamic graph
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(bench.torch_reference_shifts, dynamic=True)
    compiled(torch.randn(40, 8), torch.randn(8, 4), torch.randn(8))
    with torch._dynamo.config.patch(error_on_recompile=True):  # a recompile raises
        for S, C in ((64, 16), (100, 24), (33, 264)):
            x, w, b = torch.randn(S, C), torch.randn(C, 4), torch.randn(C)
            torch.testing.assert_close(compiled(x, w, b), bench.torch_reference(x, w, b))


def test_cli_writes_rows_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "r.json"
    result = bench.main(["--cpu", "--shapes", "64,16", "--reps", "2", "--warmup", "1", "--baselines", "eager",
                         "--no-host", "--json", str(out), "--csv", str(tmp_path / "r.csv")])
    assert json.loads(out.read_text())["rows"] == result["rows"]
    calls = {(r["call"], r["impl"]) for r in result["rows"]}
    assert {("fwd", "conv1d_silu"), ("bwd", "conv1d_silu"), ("fwd", "torch_eager")} <= calls
    assert all(r["median_us"] > 0 for r in result["rows"])
    assert "| 64 | 16 |" in capsys.readouterr().out


def _cpu_bench(*extra: str) -> list[str]:
    return ["--cpu", "--reps", "2", "--warmup", "1", "--baselines", "eager", *extra]


def test_parts_of_a_bench_merge_into_the_whole_table(tmp_path):
    """--part I/N takes every N-th shape from the I-th; --from-json joins the parts' results into
    the rows and speedups of every shape (a bench split over several device calls)."""
    shapes = ["--shapes", "40,8", "48,8", "56,8"]
    whole = bench.main(_cpu_bench(*shapes, "--no-host"))
    files = []
    for i in (1, 2):
        files.append(tmp_path / f"p{i}.json")
        bench.main(_cpu_bench(*shapes, "--part", f"{i}/2", "--json", str(files[-1]), *(["--no-host"] if i == 2 else [])))
    assert {r["S"] for r in json.loads(files[0].read_text())["rows"]} == {40, 56}
    assert {r["S"] for r in json.loads(files[1].read_text())["rows"]} == {48}
    merged = bench.main(["--from-json", *map(str, files), "--json", str(tmp_path / "m.json")])

    def keys(result, what, impl):
        return sorted((r["S"], r["C"], r["call"], r[impl]) for r in result[what])

    assert keys(merged, "rows", "impl") == keys(whole, "rows", "impl")
    assert [r["S"] for r in merged["rows"]] == sorted(r["S"] for r in merged["rows"])  # the parts interleaved
    assert keys(merged, "speedups", "baseline") == keys(whole, "speedups", "baseline")
    assert merged["host_overhead_us"]["ratio"] > 0  # part 1's
    assert [p["commit"] for p in merged["meta"]["parts"]] == [merged["meta"]["commit"]] * 2
    # a later part's row replaces an earlier one of the same shape, call and implementation
    again = bench.main(["--from-json", str(files[0]), str(files[0])])
    assert keys(again, "rows", "impl") == keys(json.loads(files[0].read_text()), "rows", "impl")


def test_parts_from_different_runs_are_refused(tmp_path):
    part = bench.main(_cpu_bench("--shapes", "40,8", "--no-host"))
    other = {**part, "meta": {**part["meta"], "gpu": "NVIDIA H100 80GB HBM3"}}
    for name, result in (("a", part), ("b", other)):
        (tmp_path / f"{name}.json").write_text(json.dumps(result))
    with pytest.raises(ValueError, match="part 2 differs from part 1 in gpu"):
        bench.main(["--from-json", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    with pytest.raises(SystemExit):
        bench.parser().parse_args(["--part", "3/2"])


def test_a_run_cut_short_keeps_the_shapes_it_measured(tmp_path, monkeypatch):
    """With --json the result so far is written after every shape: a device call that runs out of
    time (gpu-check's timeout) still brings back the rows it measured."""
    measure = bench._shape_rows

    def shape_rows(args, impls, S, C, *rest):
        if S == 48:
            raise KeyboardInterrupt  # the timeout's SIGINT, mid-shape
        return measure(args, impls, S, C, *rest)

    monkeypatch.setattr(bench, "_shape_rows", shape_rows)
    out = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        bench.main(_cpu_bench("--shapes", "40,8", "48,8", "--no-host", "--json", str(out)))
    saved = json.loads(out.read_text())
    assert {r["S"] for r in saved["rows"]} == {40} and saved["speedups"]
    assert not (tmp_path / "r.json.tmp").exists()


def test_meta_takes_the_commit_from_the_environment(monkeypatch):
    """A copied tree (the GPU machine's) may carry stale git history: CONV1D_SILU_COMMIT wins."""
    import argparse

    args = argparse.Namespace(dtype="bf16", K=4, graph=True, reps=3, layout="BLC")
    monkeypatch.setenv("CONV1D_SILU_COMMIT", "0123456789abcdef")
    assert bench.meta(torch.device("cpu"), args, 0.0)["commit"] == "0123456789abcdef"
    monkeypatch.delenv("CONV1D_SILU_COMMIT")
    assert bench.meta(torch.device("cpu"), args, 0.0)["commit"] != "0123456789abcdef"


def test_meta_reads_the_packages_checkout_from_anywhere(monkeypatch, tmp_path):
    """Started outside the checkout, the bench still names the commit of the package it runs."""
    import argparse
    import subprocess
    from pathlib import Path

    root = Path(bench.__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=root).stdout.strip()
    if not head:
        pytest.fail("the package does not run from a git checkout")
    args = argparse.Namespace(dtype="bf16", K=4, graph=True, reps=3, layout="BLC")
    monkeypatch.delenv("CONV1D_SILU_COMMIT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert bench.meta(torch.device("cpu"), args, 0.0)["commit"] == head


def test_timer_alternates_the_callables_within_every_rep():
    # the same-run ratio's two sides take turns, so a drift during the row reaches both alike
    order = []
    timer = bench.Timer(torch.device("cpu"), reps=3, warmup=2, graph=False)
    runs = [timer.prepare(lambda: order.append("ref")), timer.prepare(lambda: order.append("ours"))]
    assert order == ["ref", "ref", "ours", "ours"]  # the warm-up calls
    ref, ours = timer.times(runs)
    assert order[4:] == ["ref", "ours"] * 3
    assert len(ref) == len(ours) == 3 and all(t >= 0 for t in ref + ours)


def test_same_run_ratio_uses_the_reference_timed_with_ours():
    result = bench.main(["--cpu", "--shapes", "64,16", "--reps", "3", "--warmup", "1", "--baselines", "eager",
                         "--no-host", "--calls", "fwd", "bwd"])
    rows = {(r["call"], r["impl"]): r for r in result["rows"]}
    for call, ref in bench.SAME_BYTES.items():
        ours, plain = rows[(call, "conv1d_silu")], rows[(ref, "torch_" + ref)]
        assert ours["same_run_ratio"] == pytest.approx(ours["median_us"] / plain["median_us"])


@pytest.mark.parametrize("bias", [False, True])
def test_determinism_check_runs_on_fresh_leaves(bias):
    from conv1d_silu import causal_conv1d_silu

    x, w = torch.randn(300, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True)
    b = torch.randn(16, requires_grad=True) if bias else None
    assert bench._bitwise_repeatable(causal_conv1d_silu, x, w, b, torch.randn(300, 16))
    assert x.grad is None and w.grad is None  # the caller's leaves are left alone
    calls = []

    def drifting(x, w, b):  # a different result on every call is caught
        calls.append(1)
        return causal_conv1d_silu(x, w, b) * (1 + len(calls) * 1e-3)

    assert not bench._bitwise_repeatable(drifting, x, w, b, torch.randn(300, 16))


def test_host_overhead_reports_importable_peers_beside_ours(capsys):
    """The host line times each peer's tiny eager step beside ours and PyTorch's; a peer that
    fails at that size is left out with a note, not a crash."""

    def broken(x, w, b):
        raise RuntimeError("no kernel for this size")

    h = bench.host_overhead_us(
        torch.device("cpu"), iters=4, rounds=2, peers={"fla_triton": bench.torch_reference, "dao_cc1d": broken}
    )
    assert {"torch_x2_sum_backward", "conv1d_silu_fwd_bwd", "fla_triton_fwd_bwd"} <= set(h)
    assert "dao_cc1d_fwd_bwd" not in h and "dao_cc1d" in capsys.readouterr().err
    assert all(v > 0 for v in h.values())
    assert h["ratio"] == h["conv1d_silu_fwd_bwd"] / h["torch_x2_sum_backward"]
    meta = {"gpu": "cpu", "torch": torch.__version__, "commit": "", "dtype": "fp32", "K": 4,
            "copy_bandwidth_TBps": 1.0, "graph": False}
    line = bench_report.markdown({"meta": meta, "rows": [], "speedups": [], "host_overhead_us": h}).splitlines()[-1]
    assert "fla_triton" in line and "dao_cc1d" not in line


def test_markdown_reports_ours_beside_the_same_run_floor():
    """Per row of ours: µs, PyTorch's copy_ / add of the same shape, their same-run ratio, % of the
    copy bandwidth and determinism; the combined call has no floor, other impls no row."""

    def row(S, call, impl, us, ratio=None, det=None):
        return {"S": S, "C": 264, "call": call, "impl": impl, "median_us": us, "same_run_ratio": ratio,
                "pct_copy_bw": 90.0, "deterministic": det}

    rows = [row(32768, "fwd", "conv1d_silu", 16.0, 1.25), row(32768, "bwd", "conv1d_silu", 29.2, 1.62, True),
            row(32768, "fwdbwd", "conv1d_silu", 41.4), row(32768, "fwd", "torch_eager", 160.0),
            row(32768, "copy", "torch_copy", 12.8), row(32768, "add", "torch_add", 18.0)]
    meta = {"gpu": "cpu", "torch": torch.__version__, "commit": "", "dtype": "bf16", "K": 4,
            "copy_bandwidth_TBps": 1.0, "graph": True, "reps": 15}
    lines = bench_report.markdown({"meta": meta, "rows": rows, "speedups": []}).splitlines()
    assert "| 32768 | 264 | fwd | 16.0 | 12.8 | 1.25x | 90 |  |" in lines
    assert "| 32768 | 264 | bwd | 29.2 | 18.0 | 1.62x | 90 | yes |" in lines
    assert "| 32768 | 264 | fwdbwd | 41.4 |  |  | 90 |  |" in lines
    assert not any("160.0" in line for line in lines)
    assert not any(word in "\n".join(lines).lower() for word in ("bound", "target", "item"))


def test_markdown_puts_the_floor_of_our_pattern_beside_ours():
    """--floor's bare rows: their µs and their same-run ratio to copy_ / add beside ours, in the same
    line; no speedup against ours (the floor is ours too)."""

    def row(call, impl, us, ratio=None):
        return {"S": 65536, "C": 384, "call": call, "impl": impl, "median_us": us, "same_run_ratio": ratio,
                "pct_copy_bw": 80.0, "deterministic": None}

    rows = [row("fwd", "conv1d_silu", 41.1, 1.09), row("fwd", "bare", 39.0, 1.04), row("bwd", "conv1d_silu", 70.0, 1.27),
            row("bwd", "bare", 62.4, 1.14), row("fwdbwd", "conv1d_silu", 111.0), row("copy", "torch_copy", 37.6),
            row("add", "torch_add", 54.9)]
    meta = {"gpu": "NVIDIA H100", "torch": "2.11", "commit": "", "dtype": "bf16", "K": 4, "copy_bandwidth_TBps": 3.0,
            "graph": True, "reps": 15}
    lines = bench_report.markdown({"meta": meta, "rows": rows, "speedups": bench._speedups([])}).splitlines()
    assert "| 65536 | 384 | bwd | 70.0 | 54.9 | 1.27x | 80 |  | 62.4 | 1.14x |" in lines
    assert "| 65536 | 384 | fwdbwd | 111.0 |  |  | 80 |  |  |  |" in lines
    assert any("bare µs | bare ratio" in line for line in lines)
    with pytest.raises(ValueError, match="--floor: .* a CUDA GPU"):
        bench.main(["--cpu", "--floor", "--shapes", "4096,16", "--no-host"])


def _synthetic(gpu="NVIDIA H200", impls=("conv1d_silu", "torch_eager", "dao_cc1d", "fla_triton"),
               tokens=(32768, 1048576), scale=1.0, commit="a" * 40):
    """A saved result in the bench's format: a few C per token count, every call of each impl,
    PyTorch's copy / add, and each baseline's speedup over ours with a CI."""
    rows, speedups = [], []
    for S in tokens:
        for C in ((264, 336, 408) if S < 1048576 else (64, 1024, 4096)):
            us = S * C * 1e-5
            for impl in impls:
                factor = {"conv1d_silu": scale, "torch_eager": 20.0, "dao_cc1d": 2.0, "dao_cc1d_det": 6.0,
                          "fla_triton": 3.0}[impl]
                for call, k in (("fwd", 1.0), ("bwd", 1.5), ("fwdbwd", 2.5)):
                    rows.append({"S": S, "C": C, "call": call, "impl": impl, "median_us": us * k * factor,
                                 "same_run_ratio": 1.2 if impl == "conv1d_silu" and call != "fwdbwd" else None,
                                 "pct_copy_bw": 80.0, "deterministic": True if call == "bwd" else None})
                    if impl != "conv1d_silu":
                        speedups.append({"S": S, "C": C, "call": call, "baseline": impl,
                                         "baseline_us": us * k * factor, "ours_us": us * k * scale,
                                         "speedup": factor / scale, "ci95": (0.9 * factor / scale, 1.1 * factor / scale),
                                         "pct_copy_bw": 80.0})
            rows.append({"S": S, "C": C, "call": "copy", "impl": "torch_copy", "median_us": us * 0.8,
                         "same_run_ratio": None, "pct_copy_bw": 90.0, "deterministic": None})
            rows.append({"S": S, "C": C, "call": "add", "impl": "torch_add", "median_us": us * 1.2,
                         "same_run_ratio": None, "pct_copy_bw": 90.0, "deterministic": None})
    meta = {"gpu": gpu, "torch": "2.11", "cupy": "14", "cuda": "13.0", "commit": commit, "dtype": "bf16", "K": 4,
            "graph": True, "reps": 15, "copy_bandwidth_TBps": 4.15, "date": "2026-12-06 03:46:29"}
    return {"meta": meta, "host_overhead_us": None, "rows": rows, "speedups": speedups}


def test_plot_draws_a_row_of_panels_per_token_count(tmp_path):
    """Forward and backward µs against C, a row per token count; ours, the peers and PyTorch's
    copy_ / add in one shared legend; the eager baseline (off-scale) only in the tables."""
    path = tmp_path / "bench.png"
    fig = bench_report.plot(_synthetic(), str(path))
    assert path.stat().st_size > 10_000
    assert len(fig.axes) == 4  # 2 token counts x (forward, backward)
    assert [ax.get_title() for ax in fig.axes[:2]] == ["forward, S = 32,768 tokens", "backward, S = 32,768 tokens"]
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert len(labels) == 4 and labels[0] == "conv1d_silu (ours)"
    assert {"causal-conv1d", "flash-linear-attention"} <= set(labels)
    assert not any("eager" in label for label in labels)
    assert all(len(ax.get_lines()) == 4 for ax in fig.axes)
    assert all(not ax.get_legend() for ax in fig.axes)
    title = fig.get_suptitle()
    assert "NVIDIA H200" in title and "bf16" in title and "K = 4" in title
    # the floor of the backward panel is PyTorch's add, of the forward panel its copy_
    floor = {ax.get_title().split(",")[0]: ax.get_lines()[-1].get_ydata()[0] for ax in fig.axes[:2]}
    assert floor == {"forward": pytest.approx(32768 * 264e-5 * 0.8), "backward": pytest.approx(32768 * 264e-5 * 1.2)}
    # without peers: ours and the floor only
    fig = bench_report.figure(_synthetic(impls=("conv1d_silu", "torch_eager"), tokens=(65536,)))
    assert len(fig.axes) == 2 and len(fig.legends[0].get_texts()) == 2


def test_peers_join_the_tables_and_the_plot(tmp_path):
    """--peers adds another run's peer rows (not its ours, nor its copy / add) and a speedup against
    ours of the reported result, without a CI across runs, the peer run's own speedup beside it."""
    record = _synthetic(impls=("conv1d_silu", "torch_eager"))
    peer = _synthetic(impls=("conv1d_silu", "fla_triton"), tokens=(32768,), scale=1.25, commit="b" * 40)
    (tmp_path / "record.json").write_text(json.dumps(record))
    (tmp_path / "peer.json").write_text(json.dumps(peer))
    out = tmp_path / "both.png"
    result = bench.main(["--from-json", str(tmp_path / "record.json"), "--peers", str(tmp_path / "peer.json"),
                         "--plot", str(out), "--json", str(tmp_path / "both.json")])
    assert [r for r in result["rows"] if "peer" not in r] == record["rows"]
    added = [r for r in result["rows"] if "peer" in r]
    assert {r["impl"] for r in added} == {"fla_triton"} and len(added) == 9  # 3 C x 3 calls
    assert result["meta"]["peers"][0]["impls"] == ["fla_triton"]
    assert result["meta"]["peers"][0]["commit"] == "b" * 40 and result["meta"]["commit"] == "a" * 40
    fla = [s for s in result["speedups"] if s["baseline"] == "fla_triton"]
    assert len(fla) == 9
    for s in fla:
        assert s["speedup"] == pytest.approx(3.0)  # the peer's µs over ours of the record
        assert s["ci95"] is None and s["peer_run"]["speedup"] == pytest.approx(3.0 / 1.25)
    text = bench_report.markdown(result)
    assert "vs fla_triton" in text and "fla_triton: rows of another run" in text
    assert ": 3.00x (same run 2.40x, 2.16-2.64) |" in text
    labels = [t.get_text() for t in bench_report.figure(result).legends[0].get_texts()]
    assert "flash-linear-attention (another run)" in labels and out.exists()
    # the written result loads again, and adding the same peer twice adds nothing
    again = bench.main(["--from-json", str(tmp_path / "both.json"), "--peers", str(tmp_path / "peer.json")])
    assert len(again["rows"]) == len(result["rows"]) and len(again["speedups"]) == len(result["speedups"])
    other = {**peer, "meta": {**peer["meta"], "gpu": "NVIDIA H100 80GB HBM3"}}
    with pytest.raises(ValueError, match="peer 1 differs from the result in gpu"):
        bench_report.add_peers(record, [other])


def test_cc1d_under_its_deterministic_mode_is_a_peer_of_its_own(monkeypatch):
    """causal-conv1d with CAUSAL_CONV1D_DETERMINISTIC=1 (or torch's deterministic algorithms) runs
    another backward: its rows are named dao_cc1d_det, not mixed into dao_cc1d's."""
    import sys
    import types

    fake = types.ModuleType("causal_conv1d")
    fake.causal_conv1d_fn = lambda x, w, b, activation=None: x * 2  # (B, C, L) in, (B, C, L) out
    monkeypatch.setitem(sys.modules, "causal_conv1d", fake)
    args = bench.parser().parse_args(["--cpu", "--baselines", "cc1d"])
    x = torch.randn(50, 8)

    def peers():
        return [name for name in bench._impls(args) if name != "conv1d_silu"]

    monkeypatch.delenv("CAUSAL_CONV1D_DETERMINISTIC", raising=False)
    assert peers() == ["dao_cc1d"]
    torch.testing.assert_close(bench._impls(args)["dao_cc1d"](x, None, None), x * 2)
    monkeypatch.setenv("CAUSAL_CONV1D_DETERMINISTIC", "0")
    assert peers() == ["dao_cc1d"]
    monkeypatch.setenv("CAUSAL_CONV1D_DETERMINISTIC", "1")
    assert peers() == ["dao_cc1d_det"]
    torch.testing.assert_close(bench._impls(args, "BCL")["dao_cc1d_det"](x, None, None), x * 2)
    monkeypatch.delenv("CAUSAL_CONV1D_DETERMINISTIC")
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert peers() == ["dao_cc1d_det"]


def test_the_deterministic_cc1d_run_joins_as_its_own_column():
    """A run under CAUSAL_CONV1D_DETERMINISTIC=1, joined with --peers: its dao_cc1d_det rows get a
    column after causal-conv1d's, a line of the plot and a place in the host line."""
    record = _synthetic(impls=("conv1d_silu", "torch_eager", "dao_cc1d"))
    record["host_overhead_us"] = {"torch_x2_sum_backward": 134.0, "conv1d_silu_fwd_bwd": 225.0, "ratio": 1.69,
                                  "dao_cc1d_fwd_bwd": 473.0, "dao_cc1d_det_fwd_bwd": 480.0}
    peer = _synthetic(impls=("conv1d_silu", "dao_cc1d_det"), tokens=(32768,), commit="b" * 40)
    result = bench_report.add_peers(record, [peer])
    assert {r["impl"] for r in result["rows"] if "peer" in r} == {"dao_cc1d_det"}
    lines = bench_report.markdown(result).splitlines()
    assert "| S | C | call | ours µs | vs torch_eager | vs dao_cc1d | vs dao_cc1d_det |" in lines
    assert any(line.startswith("dao_cc1d_det: rows of another run") for line in lines)
    speedups = [line for line in lines if line.startswith("| 32768 | 264 | bwd |")][-1]
    assert speedups.endswith("| 259.5: 2.00x (1.80-2.20) | 778.6: 6.00x (same run 6.00x, 5.40-6.60) |")
    assert lines[-1].endswith("dao_cc1d 473, dao_cc1d_det 480")
    labels = [t.get_text() for t in bench_report.figure(result).legends[0].get_texts()]
    assert "causal-conv1d, deterministic (another run)" in labels and "causal-conv1d" in labels


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@pytest.mark.parametrize("files, columns", [
    (["h200.json", "--peers", "h200-fla.json"], ("vs torch_compile", "vs fla_triton")),
    (["h100.json", "--peers", "h100-cc1d-det.json"], ("vs dao_cc1d", "vs dao_cc1d_det", "bare µs | bare ratio")),
])
def test_the_committed_results_load_and_plot(files, columns, tmp_path):
    """The bench of record per GPU reports again from its JSON (the .md and .png are regenerated
    this way, without a GPU), and the committed .md is that report."""
    args = [a if a.startswith("--") else str(RESULTS / a) for a in files]
    result = bench.main(["--from-json", *args, "--markdown", str(tmp_path / "r.md"), "--plot", str(tmp_path / "r.png")])
    ours = [r for r in result["rows"] if r["impl"] == "conv1d_silu"]
    shapes = {(r["S"], r["C"]) for r in ours}
    assert len(ours) == 3 * len(shapes) and shapes <= set(bench.default_shapes())
    # the H200's results were taken before the Mamba rows joined the default list; every other row is there
    assert set(bench.default_shapes()) - shapes <= set(bench.MAMBA_SHAPES)
    assert all(r["same_run_ratio"] for r in ours if r["call"] != "fwdbwd")
    assert len(bench_report.figure(result).axes) == 2 * len({S for S, _ in shapes})
    text = (tmp_path / "r.md").read_text()
    assert "| 250340 | 384 | bwd |" in text and all(column in text for column in columns)
    assert text == (RESULTS / files[0]).with_suffix(".md").read_text()


def test_decode_mode_runs_the_step_and_reports_it(tmp_path):
    """--decode times causal_conv1d_update (on the CPU here: the CPU step's wall time per call)."""
    from conv1d_silu import bench_decode

    rows = bench_decode.run(torch.device("cpu"), C=64, batches=(1, 3), calls=3)
    assert [r["B"] for r in rows] == [1, 3] and all(r["host_us"] > 0 and r["state_len"] == 4 for r in rows)
    text = bench_decode.markdown(rows, "CPU")
    assert "| 3 | 64 | 4 |" in text
    out = tmp_path / "decode.json"
    result = bench.main(["--decode", "--cpu", "--json", str(out)])
    assert result["device"] == "CPU" and len(result["decode"]) == len(bench_decode.BATCHES)


@pytest.mark.parametrize("device", DEVICES)
def test_step_mode_times_a_training_step(device, tmp_path):
    """--step times a Linear + CausalConv1dSiLU block's forward + backward per mode (eager only
    without a GPU; compiled and reduce-overhead on one), each step's bits checked against eager's."""
    from conv1d_silu import bench_step

    # on a GPU the bench's own step (bf16): a compiled Linear's bits are eager's there (test_gpu's
    # reduce-overhead test); at other shapes and dtypes inductor may lower it differently
    shape, dtype = (bench_step.SHAPE, torch.bfloat16) if device == "cuda" else ((2, 32, 16), torch.float32)
    rows = bench_step.run(torch.device(device), dtype=dtype, shape=shape, rounds=2, steps=2, warmup=3)
    want = bench_step.MODES if device == "cuda" else ("eager",)
    assert tuple(r["mode"] for r in rows) == want
    for r in rows:
        assert r["same_bits"] and r["wall_us"] > 0 and r["cpu_us"] > 0, r
    assert "| eager |" in bench_step.markdown(rows, device) and "| yes |" in bench_step.markdown(rows, device)
    if device == "cpu":
        out = tmp_path / "step.json"
        result = bench.main(["--step", "--cpu", "--json", str(out)])
        assert result["device"] == "CPU" and [r["mode"] for r in result["step"]] == ["eager"]
        assert json.loads(out.read_text())["step"][0]["C"] == bench_step.SHAPE[2]


def test_layout_bcl_times_channel_first_calls():
    """--layout BCL: x is (B, C, L) channel-first; ours (layout='BCL') and eager F.conv1d agree on it,
    and the run records its layout (parts and peers of another layout do not join it)."""
    args = bench.parser().parse_args(["--cpu", "--layout", "BCL", "--baselines", "eager", "--shapes", "4096,16"])
    x, w, b, dy = bench.shape_inputs(4096, 16, 4, torch.float32, torch.device("cpu"), "BCL")
    assert x.shape == (1, 16, 4096) and x.is_contiguous() and dy.shape == x.shape
    assert bench.seqlen(16384, "BCL") == 2048 and bench.seqlen(16384, "BLC") is None
    impls = bench._impls(args, "BCL")
    torch.testing.assert_close(impls["conv1d_silu"](x, w, b), impls["torch_eager"](x, w, b), rtol=1e-5, atol=1e-5)
    result = bench.main(["--cpu", "--layout", "BCL", "--baselines", "eager", "--shapes", "4096,16",
                         "--reps", "2", "--no-host", "--calls", "fwd"])
    assert result["meta"]["layout"] == "BCL" and "channel-first" in bench_report.markdown(result)
    other = {**result, "meta": {**result["meta"], "layout": "BLC"}}
    with pytest.raises(ValueError, match="layout"):
        bench_report.merge_results([result, other])


def test_a_channel_first_run_times_our_channel_last_call_beside_it(kernel_backend):
    """--layout BCL --with-channel-last: ours on a channel-last copy of the same values joins the run
    (the channel-last kernels on the kernel backends), with a speedup against ours channel-first; an
    channel-first program named by --baseline-programs runs beside them."""
    args = bench.parser().parse_args(
        ["--layout", "BCL", "--with-channel-last", "--baselines", "--calls", "fwd", "bwd", "--dtype", "fp32", "--no-host",
         "--baseline-programs", "bwd_bcl_chain2"]
    )
    device = torch.device(kernel_backend.device)
    x, w, b, dy = bench.shape_inputs(4096, 16, 4, torch.float32, device, "BCL")
    last = bench.channel_last(x)
    assert last.stride(1) == 1 and torch.equal(last, x) and last.requires_grad and last.is_leaf
    timer = bench.Timer(device, reps=2, warmup=1, graph=False)
    if kernel_backend.name == "emu":
        ops._launcher.launches.clear()
    rows = bench._shape_rows(args, bench._impls(args, "BCL"), 4096, 16, timer, timer, 1e12, torch.float32, device)
    assert {(r.impl, r.call) for r in rows} >= {
        ("conv1d_silu[BLC]", "fwd"), ("conv1d_silu[BLC]", "bwd"), ("conv1d_silu[bwd_bcl_chain2]", "bwd")
    }
    assert {s["baseline"] for s in bench._speedups(rows)} == {"conv1d_silu[BLC]", "conv1d_silu[bwd_bcl_chain2]"}
    if kernel_backend.name == "emu":
        kernels = {launch.kernel.split("<")[0] for launch in ops._launcher.launches}
        assert {"conv1d_silu_fwd", "conv1d_silu_bwd", "conv1d_silu_fwd_bcl", "conv1d_silu_bwd_bcl"} <= kernels
        assert any(launch.kernel.endswith(", true, 2>") for launch in ops._launcher.launches)  # the chained round


@pytest.mark.parametrize(
    "S, C, fwd_program, bwd_program, dtype",
    [
        (3000, 72, "fwd_rows", "rowgroup", torch.float32),  # tiled, one slab per lane
        (3000, 264, "fwd_flat16_8b", "rowgroup_flat2_8b", torch.bfloat16),  # flat, two slabs per lane
        (5000, 40, "fwd_rows16_8b", "rowgroup_long_flat32_8b", torch.float32),  # level-2 CTAs
        (5000, 64, None, "rowgroup_sm_long", torch.bfloat16),  # routed forward; persistent backward
    ],
)
def test_floor_runs_the_programs_loads_and_stores(kernel_backend, S, C, fwd_program, bwd_program, dtype):
    """--floor's bare launches keep the program's rows: y = x, dx[t - (K-1)] = x[t] + dy[t] (0 in
    the last K-1 rows), every row and channel written in the program's geometry."""
    from conv1d_silu import bench_floor

    K, device = 4, kernel_backend.device
    g = torch.Generator(device=device).manual_seed(S + C)
    x, dy = (torch.randn(S, C, device=device, dtype=dtype, generator=g) for _ in range(2))
    w = torch.randn(C, K, device=device, dtype=dtype, generator=g)
    b = torch.randn(C, device=device, dtype=dtype, generator=g)
    floor = bench_floor.calls(x, w, b, dy, fwd_program, bwd_program)
    floor.y.fill_(float("nan"))
    floor.dx.fill_(float("nan"))
    floor.fwd()
    floor.bwd()
    assert torch.equal(floor.y, x)
    assert torch.equal(floor.dx[: S - K + 1], (x + dy)[K - 1:])
    assert torch.equal(floor.dx[S - K + 1:], torch.zeros_like(x[S - K + 1:]))
    with pytest.raises(ValueError, match="no bare launch"):
        bench_floor.calls(x, w, b, dy, "reference")


@pytest.mark.parametrize(
    "B, C, L, dtype, climb",
    [
        (4, 3, 2048, torch.bfloat16, False),  # rows of whole slabs, 16-byte accesses
        (1, 2, 5000, torch.float32, False),  # one sequence, two parts of a channel, its last slab 8 tokens long
        (1, 2, 1 << 16, torch.bfloat16, True),  # parts of several rounds (a part above tree level 2, forced)
    ],
)
def test_channel_first_floor_runs_the_programs_loads_and_stores(
    kernel_backend, monkeypatch, B, C, L, dtype, climb
):
    """--floor with --layout BCL: the channel-first programs' bare launches, y = x and dx = x + dy
    with the K-1 taps before each slab added to its first
    token (0 before a row's start), every token written in x's layout; x and dy chunks of wider
    tensors (strides of their own)."""
    from conv1d_silu import bench_floor, gpu_bcl

    K, device = 4, kernel_backend.device
    g = torch.Generator(device=device).manual_seed(B + C + L)
    x, dy = (torch.randn(B, 2 * C + 1, L, device=device, dtype=dtype, generator=g)[:, 1 : C + 1] for _ in range(2))
    w = torch.randn(C, K, device=device, dtype=dtype, generator=g)
    if climb:
        monkeypatch.setattr(gpu_bcl, "top_level", lambda root: root - 1)
    gpu_bcl.backward_launches.cache_clear()
    try:
        floor = bench_floor.calls(x, w, None, dy)
    finally:
        gpu_bcl.backward_launches.cache_clear()
    floor.y.fill_(float("nan"))
    floor.dx.fill_(float("nan"))
    floor.fwd()
    floor.bwd()
    assert floor.y.shape == x.shape and torch.equal(floor.y, x)
    want = x.float() + dy.float()
    # each slab's first token (slabs of 32, rows of whole slabs)
    starts = torch.arange(0, L, 32, device=device)
    for m in range(K - 1):  # tap m of token l is token l - (K-1) + m, added in that order
        src = starts - (K - 1) + m
        want[..., starts[src >= 0]] += x.float()[..., src[src >= 0]]
    assert torch.equal(floor.dx, want.to(dtype))


def test_a_chained_program_has_no_floor(kernel_backend):
    from conv1d_silu import bench_floor

    x = torch.randn(1, 2, 256, device=kernel_backend.device, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="chained round.*no bare launch"):
        bench_floor.calls(x, torch.randn(2, 4, device=x.device), None, x, bwd_program="bwd_bcl_chain2")


def test_channel_first_floor_needs_the_simple_walk(kernel_backend):
    """Rows that are not whole slabs take the document walk, which has no bare form: said, not run."""
    from conv1d_silu import bench_floor

    x = torch.randn(3, 2, 40, device=kernel_backend.device)
    with pytest.raises(ValueError, match="document walk, which has no bare launch"):
        bench_floor.calls(x, torch.randn(2, 4, device=x.device), None, x)


def test_floor_takes_channel_last_or_channel_first_rows_only():
    from conv1d_silu import bench_floor

    x = torch.randn(2, 64, 8).transpose(1, 2)  # neither layout's rows
    with pytest.raises(ValueError, match="x: the floor takes channel-last"):
        bench_floor.calls(x, torch.randn(8, 4), None, x)


@pytest.mark.parametrize("layout, S", [("BLC", 3000), ("BCL", 4096)])
def test_floor_rows_join_ours_in_the_same_turns(kernel_backend, layout, S):
    """With --floor each of our fwd / bwd rows gets a bare row, timed in the same turns as ours and
    PyTorch's copy_ / add (a same-run ratio to them), in either layout."""
    args = bench.parser().parse_args(
        ["--floor", "--baselines", "--calls", "fwd", "bwd", "fwdbwd", "--dtype", "fp32", "--no-host", "--layout", layout]
    )
    device = torch.device(kernel_backend.device)
    timer = bench.Timer(device, reps=2, warmup=1, graph=False)
    rows = bench._shape_rows(args, bench._impls(args, layout), S, 64, timer, timer, 1e12, torch.float32, device)
    bare = [r for r in rows if r.impl == "bare"]
    assert [r.call for r in bare] == ["fwd", "bwd"]
    assert all(len(r.times_us) == 2 and r.same_run_ratio > 0 for r in bare)
    assert not any(s["baseline"] == "bare" for s in bench._speedups(rows))


def test_a_floor_that_fails_leaves_its_row_without_bare_columns(kernel_backend, monkeypatch, capsys):
    """A floor whose launch cannot be built or run is said on stderr; ours and copy_ / add are still timed."""
    from conv1d_silu import bench_floor

    def broken(*args):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(bench_floor, "calls", broken)
    args = bench.parser().parse_args(["--floor", "--baselines", "--calls", "fwd", "bwd", "--dtype", "fp32", "--no-host"])
    device = torch.device(kernel_backend.device)
    timer = bench.Timer(device, reps=2, warmup=1, graph=False)
    rows = bench._shape_rows(args, bench._impls(args), 3000, 64, timer, timer, 1e12, torch.float32, device)
    assert {r.impl for r in rows} == {"conv1d_silu", "torch_copy", "torch_add"}
    assert "floor S=3000 C=64 skipped: RuntimeError('no such kernel')" in capsys.readouterr().err


def test_a_bare_launch_is_held_to_the_routed_programs_ctas_per_sm(monkeypatch):
    """Without the math a kernel needs fewer registers, so more of its CTAs would share an SM:
    held_to gives the bare launch the least shared memory (in SMEM_STEP steps) that keeps it to the
    routed launch's CTAs per SM, and leaves a launch that already keeps to them alone."""
    from dataclasses import replace

    from conv1d_silu import bench_floor, runtime
    from conv1d_silu.runtime import DeviceLimits, Launch

    smem_per_sm, reserved = 228 * 1024, 1024

    class Occupancy(bench_floor.gpu.Launcher):
        def max_active_blocks(self, launch, device):
            by_regs = 16 if launch.kernel.endswith(", true>") else 4  # bare: 32 registers, routed: 128
            return max(1, min(by_regs, smem_per_sm // (launch.smem + reserved)))

    monkeypatch.setattr(runtime, "device_limits", lambda index: DeviceLimits(132, 1024, 48 * 1024, 227 * 1024))
    routed = Launch("conv1d_silu_bwd", "conv1d_silu_bwd<x, false>", (264, 1, 1), 128, 20 * 1024, None)
    bare = bench_floor.bare(routed)
    launcher, device = Occupancy(), torch.device("cuda", 0)
    held = bench_floor.held_to(bare, routed, launcher, device)
    assert launcher.max_active_blocks(routed, device) == 4 and launcher.max_active_blocks(bare, device) == 10
    assert launcher.max_active_blocks(held, device) == 4 and held.smem % bench_floor.SMEM_STEP == 0
    less = replace(held, smem=held.smem - bench_floor.SMEM_STEP)
    assert launcher.max_active_blocks(less, device) > 4
    assert replace(held, smem=bare.smem) == bare
    assert bench_floor.held_to(routed, routed, launcher, device) is routed
