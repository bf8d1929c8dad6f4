"""Route table: selection on both sides of every band edge and token floor, registry invariants, the
tables as package data (loading, validation) and the tuner that writes them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from conv1d_silu import routes
from conv1d_silu.routes import INF, PROGRAMS, ROUTES, VARIANTS, RouteTableError, Rule, select

TABLES = Path(routes.__file__).parent / "route_tables"

OTHER = [v for v in VARIANTS if v != "bwd"]


@pytest.mark.parametrize(
    "C,S,want",
    [
        (263, 32768, "rowgroup"), (264, 32768, "rowgroup_sm"), (295, 32768, "rowgroup_sm"), (296, 32768, "rowgroup"),
        (343, 32768, "rowgroup"), (344, 32768, "rowgroup_sm"), (415, 32768, "rowgroup_sm"), (416, 32768, "rowgroup"),
        (511, 32768, "rowgroup"), (512, 32768, "rowgroup"), (300, 32768, "rowgroup"), (264, 32767, "rowgroup"),
        (344, 32767, "rowgroup"), (415, 32767, "rowgroup"), (256, 262143, "rowgroup"),
        (256, 262144, "rowgroup_sm_long"), (255, 262144, "rowgroup"), (257, 262144, "rowgroup"),
        (264, 262144, "rowgroup_sm"), (511, 10**6, "rowgroup"),
    ],
)
def test_sm107a_bwd_rule(C, S, want):
    # FlashInfer's det-train kernel rules for sm_107a, kept verbatim (route_tables/sm_107a.json)
    assert select("sm_107a", "bwd", C, S).name == want


@pytest.mark.parametrize("variant", OTHER)
@pytest.mark.parametrize("C,S", [(264, 32768), (344, 32768), (415, 10**6), (256, 262144), (263, 32767), (511, 32768)])
def test_sm107a_rule_leaves_other_variants_alone(variant, C, S):
    want = "fwd_rows" if variant.startswith("fwd") else "rowgroup"
    assert select("sm_107a", variant, C, S).name == want


@pytest.mark.parametrize("arch", ["sm_100a", "sm_103a"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("C,S", [(264, 32768), (344, 65536), (256, 262144), (4096, 1 << 20)])
def test_blackwell_routes_are_the_row_group_programs(arch, variant, C, S):
    want = "fwd_rows" if variant.startswith("fwd") else "rowgroup"
    assert select(arch, variant, C, S).name == want


def test_every_band_edge_and_floor_of_every_route():
    """Each rule is chosen (among the rules of its layout) at one point at least just inside its box,
    so no rule is dead; just outside its box it does not match."""
    for arch, table in ROUTES.items():
        for variant, rules in table.items():
            for rule in rules:
                if rule.is_default:
                    continue
                inside = [(rule.c_lo, rule.s_min), (rule.c_hi - 1, rule.s_min), (rule.c_lo, max(rule.s_min, 1) * 4)]
                dtype = next(iter(rule.dtypes)) if rule.dtypes else "bfloat16"
                K = next(iter(rule.ks)) if rule.ks else 4
                layout = PROGRAMS[rule.program].layout
                chosen = [
                    next(r for r in rules if PROGRAMS[r.program].layout == layout and r.matches(C, S, K, dtype))
                    for C, S in inside
                ]
                assert any(first is rule for first in chosen), (arch, variant, rule)  # no rule is dead
                outside = [(rule.c_lo - 1, rule.s_min), (rule.c_hi, rule.s_min), (rule.c_lo, rule.s_min - 1)]
                for C, S in outside:
                    if C < 0 or S < 0 or rule.c_hi >= INF and C >= INF:
                        continue
                    assert not rule.matches(C, S, 4, "bfloat16"), (arch, variant, C, S)


def test_registry_invariants():
    for arch, table in ROUTES.items():
        assert set(table) == set(VARIANTS), arch
        for variant, rules in table.items():
            assert rules[-1].is_default, (arch, variant)
            direction = variant[:3]
            for rule in rules:
                program = PROGRAMS[rule.program]
                assert program.direction == direction, (arch, variant, rule.program)
                assert program.routed, (arch, variant, rule.program)
                assert rule.c_lo < rule.c_hi
            # two rules of one layout at one floor (and the same dtype / K sets) never overlap in C
            body = [r for r in rules if not r.is_default]
            for a in range(len(body)):
                for b in range(a + 1, len(body)):
                    ra, rb = body[a], body[b]
                    key = (PROGRAMS[ra.program].layout, ra.s_min, ra.dtypes, ra.ks)
                    if key == (PROGRAMS[rb.program].layout, rb.s_min, rb.dtypes, rb.ks):
                        assert ra.c_hi <= rb.c_lo or rb.c_hi <= ra.c_lo, (arch, variant, ra, rb)


def test_every_program_named_exists_and_every_program_runs_on_sm90():
    for name, program in PROGRAMS.items():
        assert program.name == name
        if program.direction == "bwd":
            assert program.slabs_per_lane in (1, 2, 4, 8)
            assert program.cta_lanes * program.max_tile_vectors <= 256
    assert ROUTES["sm_90"]["bwd"][-1].program == "rowgroup"


def test_unknown_arch_falls_back_with_one_warning(caplog):
    routes._warn_unmeasured.cache_clear()
    with caplog.at_level(logging.WARNING, logger="conv1d_silu"):
        assert select("sm_999", "bwd", 384, 65536).name == "rowgroup"
        assert select("sm_999", "fwd", 384, 65536).name == "fwd_rows"
    assert sum("sm_999" in r.message for r in caplog.records) == 1


def test_arch_names():
    assert routes.arch_of((9, 0)) == "sm_90"
    assert routes.arch_of((10, 0)) == "sm_100a"
    assert routes.arch_of((10, 3)) == "sm_103a"
    assert routes.arch_of((10, 7)) == "sm_107a"
    assert routes.arch_of((8, 0)) == "generic"


@pytest.mark.parametrize("capability,name", [((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 9), "sm_89"), ((12, 0), "sm_120a")])
def test_every_gpu_causal_conv1d_builds_for_gets_the_default_route_and_one_warning(caplog, capability, name):
    routes._warn_unmeasured.cache_clear()
    with caplog.at_level(logging.WARNING, logger="conv1d_silu"):
        for _ in range(3):
            arch = routes.arch_of(capability)
            assert arch == "generic"
            assert select(arch, "bwd", 384, 65536).name == "rowgroup"
            assert select(arch, "fwd_dt", 384, 65536).name == "fwd_rows"
    assert [r.message.split(";")[0] for r in caplog.records] == [f"conv1d_silu: no measured route table for {name}"]


def test_any_arch_can_have_a_table(tmp_path, caplog):
    """A table measured on a GPU without one (the tuner names it by the device's arch) loads and
    routes that arch; without it the arch warns and runs the defaults."""
    (tmp_path / "sm_86.json").write_text(routes.format_table("sm_86", {"gpu": "test"}, {"bwd": [routes.Rule("rowgroup_8b", 0, 512, 0)]}))
    table = routes.route_table(tmp_path)
    assert table["sm_86"]["bwd"][0].program == "rowgroup_8b"
    assert routes.arch_name((8, 6)) == "sm_86" and routes.arch_name((12, 0)) == "sm_120a"


def test_gpus_below_sm80_get_a_clear_error(monkeypatch):
    from conv1d_silu import ops

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (7, 5))
    ops._cuda_arch.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=r"compute capability 8.0 or newer.*7\.5.*program='reference'"):
            ops._cuda_arch(0)
    finally:
        ops._cuda_arch.cache_clear()


def test_variant_names():
    assert routes.variant_name("bwd", True, False, True) == "bwd_bias_fp32g"
    assert routes.variant_name("bwd", False, False, True) == "bwd_fp32g"
    assert routes.variant_name("bwd", True, True, True) == "bwd_dt"
    assert routes.variant_name("fwd", True, False) == "fwd_bias"
    with pytest.raises(ValueError, match="variant"):
        select("sm_90", "bwd_nope", 1, 1)


def test_forcing_by_argument_and_environment(monkeypatch):
    assert routes.forced("rowgroup_sm", "bwd", True).name == "rowgroup_sm"
    assert routes.forced("rowgroup_sm", "fwd", True) is None  # a backward program leaves the forward routed
    assert routes.forced("reference", "fwd", False).name == "reference"
    with pytest.raises(ValueError, match="program"):
        routes.forced("bogus", "bwd", True)
    from conv1d_silu import config

    monkeypatch.setenv("CONV1D_SILU_PROGRAM", "rowgroup_long")
    assert config.forced_program() == "rowgroup_long"


def test_eager_call_resolves_the_program_environment_once(monkeypatch):
    """An eager call reads CONV1D_SILU_PROGRAM once, in the forward: its backward runs under the
    same resolution even when the environment changed in between."""
    import torch

    from conv1d_silu import ops
    from conv1d_silu.api import causal_conv1d_silu

    seen = []
    real = ops.choose
    monkeypatch.setattr(ops, "choose", lambda d, *a: seen.append((d, a[-1])) or real(d, *a))
    monkeypatch.setattr(ops, "EAGER_CALLS", {})  # no call of this signature seen before
    x = torch.randn(40, 8, requires_grad=True)
    w = torch.randn(8, 4, requires_grad=True)
    for env, want in (("reference", "reference"), (None, ops.ROUTED)):
        seen.clear()
        if env:
            monkeypatch.setenv("CONV1D_SILU_PROGRAM", env)
        y = causal_conv1d_silu(x, w)
        monkeypatch.setenv("CONV1D_SILU_PROGRAM", "bogus")  # read now, this would raise
        y.sum().backward()
        monkeypatch.delenv("CONV1D_SILU_PROGRAM")
        assert seen == [("fwd", want), ("bwd", want)]


def test_tile_vectors_balance():
    assert routes.tile_vectors(33, 32) == 17
    assert routes.tile_vectors(64, 32) == 32
    assert routes.tile_vectors(512, 32) == 32
    assert routes.tile_vectors(1, 32) == 1


def test_tile_vectors_align():
    # 66 vectors (C = 264 in 8-byte bf16 vectors): 5 balanced tiles of 14, or aligned 12-vector tiles
    # (6 x 12 = 72 thread slots; 16 would leave 14 of 80 idle)
    assert routes.tile_vectors(66, 16) == 14
    assert routes.tile_vectors(66, 16, align=4) == 12
    assert routes.tile_vectors(66, 32, align=4) == 24  # 3 x 24
    assert routes.tile_vectors(98, 32, align=4) == 20  # 5 x 20 = 100 slots, not 4 x 28 = 112
    assert routes.tile_vectors(64, 16, align=4) == 16
    assert routes.tile_vectors(6, 32, align=4) == 8  # one tile, rounded up to the alignment
    assert routes.tile_vectors(66, 32, align=64) == 32  # never past the cap
    for n in range(1, 600):
        for cap, align in ((16, 4), (32, 4), (32, 2), (32, 16)):
            t = routes.tile_vectors(n, cap, align)
            assert t <= cap and (t % align == 0 or t == cap)


def test_tuner_chooses_bands_and_floors_from_measurements():
    from conv1d_silu.tune import Measurement, choose

    def m(C, S, rowgroup, sm):
        t = {"rowgroup": rowgroup, "rowgroup_long": rowgroup * 1.2, "rowgroup_sm": sm, "rowgroup_sm_long": rowgroup * 1.5}
        return Measurement("bwd", C, S, t, {k: 0.01 for k in t})

    ms = []
    for C in (256, 264, 272, 280):
        for S in (32768, 65536, 262144):
            fast = C in (264, 272) and S >= 65536
            ms.append(m(C, S, 100.0, 80.0 if fast else 101.0))
    rules = choose(ms)["bwd"]
    assert [(r.program, r.c_lo, r.c_hi, r.s_min) for r in rules] == [("rowgroup_sm", 264, 280, 46340)]  # isqrt(32768 * 65536)
    # noise: a 2 % gain is not a win
    ms2 = [m(256, S, 100.0, 98.0) for S in (32768, 65536)]
    assert choose(ms2)["bwd"] == []


def test_tuner_keeps_a_band_through_ties_instead_of_splitting_on_noise():
    from conv1d_silu.tune import Measurement, choose

    # two programs both beat the default by far and tie within 1 %, alternating which is faster
    ms = []
    for i, C in enumerate((256, 264, 272, 280, 288)):
        for S in (32768, 65536):
            a, b = (70.0, 70.5) if i % 2 else (70.5, 70.0)
            t = {"rowgroup": 100.0, "rowgroup_8b": a, "rowgroup_long_8b": b}
            ms.append(Measurement("bwd", C, S, t, {k: 0.01 for k in t}))
    rules = choose(ms)["bwd"]
    assert len(rules) == 1 and (rules[0].c_lo, rules[0].c_hi, rules[0].s_min) == (256, INF, 32768)
    # a clear winner still takes its own band
    for m in ms:
        if m.C == 288:
            m.times["rowgroup_8b"] = 60.0
    rules = choose(ms)["bwd"]
    assert [(r.program, r.c_lo, r.c_hi) for r in rules][-1] == ("rowgroup_8b", 288, INF)


def test_tuner_adds_a_second_token_floored_program_where_it_beats_the_first():
    from conv1d_silu.tune import Measurement, choose

    ms = []
    # rowgroup_8b beats the default everywhere; rowgroup_long_8b only from 262144 tokens, where it
    # also beats rowgroup_8b
    times = {32768: (100, 60, 110), 65536: (200, 120, 205), 262144: (800, 480, 400), 1048576: (3200, 1900, 1600)}
    for C in (256, 264):
        for S, (default, short, long) in times.items():
            t = {"rowgroup": default, "rowgroup_8b": short, "rowgroup_long_8b": long}
            ms.append(Measurement("bwd", C, S, t, {k: 0.01 for k in t}))
    rules = [(r.program, r.c_lo, r.c_hi, r.s_min) for r in choose(ms)["bwd"]]
    # the floor sits halfway (geometrically) between 65536, where it lost, and 262144, where it won
    assert rules == [("rowgroup_long_8b", 256, INF, 131072), ("rowgroup_8b", 256, INF, 32768)]
    for S in (32767, 32768, 131071, 131072):  # and the route table built from them selects so
        rule = next((r for r in choose(ms)["bwd"] if r.matches(260, S, 4, "bfloat16")), None)
        assert (rule.program if rule else None) == (None if S < 32768 else "rowgroup_8b" if S < 131072 else "rowgroup_long_8b")


def test_tuner_never_routes_a_program_marked_unrouted():
    from conv1d_silu.tune import Measurement, choose

    # fwd_rows_8b is fastest by far but has a placement-dependent slow mode (Program.routed = False)
    ms = [Measurement("fwd", C, S, {"fwd_rows": 100.0, "fwd_rows_8b": 50.0, "fwd_rows16_8b": 60.0},
                      {"fwd_rows": 0.01, "fwd_rows_8b": 0.01, "fwd_rows16_8b": 0.01})
          for C in (256, 264) for S in (32768, 65536)]
    assert not PROGRAMS["fwd_rows_8b"].routed
    assert [(r.program, r.c_lo, r.s_min) for r in choose(ms)["fwd"]] == [("fwd_rows16_8b", 256, 32768)]


def test_tuner_merges_dumps_by_variant_shape_and_program():
    from conv1d_silu.tune import merge

    def m(variant, C, S, times):
        return {"variant": variant, "C": C, "S": S, "times": times, "spread": {k: 0.01 for k in times}}

    first = {"meta": {"gpu": "one"}, "measurements": [m("bwd", 256, 32768, {"rowgroup": 100.0, "rowgroup_8b": 60.0})]}
    second = {"meta": {"gpu": "two"}, "measurements": [
        m("bwd", 256, 32768, {"rowgroup_8b": 58.0, "rowgroup64_8b": 50.0}),  # a later run adds programs
        m("fwd", 256, 32768, {"fwd_rows": 10.0}),  # and variants
    ]}
    ms, meta = merge([first, second])
    assert meta == {"gpu": "one"}
    got = {(x.variant, x.C, x.S): x.times for x in ms}
    assert got == {
        ("bwd", 256, 32768): {"rowgroup": 100.0, "rowgroup_8b": 58.0, "rowgroup64_8b": 50.0},
        ("fwd", 256, 32768): {"fwd_rows": 10.0},
    }


def test_tuner_writes_the_merged_dump_of_its_parts(tmp_path, capsys):
    # gpu-check tune-parts leaves one dump per variant; --from-json ... --json writes them as one
    import json

    from conv1d_silu import tune

    def part(variant, programs, commit):
        ms = [{"variant": variant, "C": C, "S": S, "times": {p: 10.0 + i for i, p in enumerate(programs)},
               "spread": {p: 0.01 for p in programs}} for C in (256, 264) for S in (32768, 65536)]
        return {"meta": {"gpu": "H200", "commit": commit, "date": "d"}, "measurements": ms}

    files = []
    for variant, programs in (("bwd", ["rowgroup", "rowgroup_8b"]), ("fwd", ["fwd_rows", "fwd_rows16_8b"])):
        files.append(tmp_path / f"tune-{variant}.json")
        files[-1].write_text(json.dumps(part(variant, programs, "abc")))
    out = tmp_path / "merged.json"
    tune.main(["--from-json", *map(str, files), "--json", str(out), "--no-write"])
    merged = json.loads(out.read_text())
    assert len(merged["measurements"]) == 8
    assert merged["meta"]["gpu"] == "H200"
    run = {"commit": "abc", "date": "d", "gpu": "H200", "S": [32768, 65536]}
    # one run; the parts timed only these programs of their directions, so they name them
    assert merged["meta"]["parts"] == [{**run, "variants": ["bwd"], "programs": ["rowgroup", "rowgroup_8b"]},
                                       {**run, "variants": ["fwd"], "programs": ["fwd_rows", "fwd_rows16_8b"]}]
    # a later part re-timing one variant's programs takes it over, the merged dump keeps the others' parts
    files.append(tmp_path / "tune-fwd-new.json")
    files[-1].write_text(json.dumps(part("fwd", ["fwd_rows", "fwd_rows16_8b"], "def")))
    tune.main(["--from-json", str(out), str(files[-1]), "--json", str(out), "--no-write"])
    meta = json.loads(out.read_text())["meta"]
    assert [(p["commit"], p["variants"]) for p in meta["parts"]] == [("abc", ["bwd"]), ("def", ["fwd"])]
    assert tune._measured_at(meta) == ("commits abc on H200 (bwd at S = 32768, 65536, programs rowgroup, rowgroup_8b: d); "
                                       "def on H200 (fwd at S = 32768, 65536, programs fwd_rows, fwd_rows16_8b: d)")
    # a run on another GPU at other token counts adds a part and names both GPUs; the earlier part stays
    other = part("bwd", ["rowgroup", "rowgroup_8b"], "ghi")
    other["meta"]["gpu"] = "H100"
    for m in other["measurements"]:
        m["S"] //= 8
    files.append(tmp_path / "tune-bwd-short.json")
    files[-1].write_text(json.dumps(other))
    tune.main(["--from-json", str(out), str(files[-1]), "--json", str(out), "--no-write"])
    meta = json.loads(out.read_text())["meta"]
    assert [(p["commit"], p["gpu"], p["S"]) for p in meta["parts"]] == [
        ("abc", "H200", [32768, 65536]), ("def", "H200", [32768, 65536]), ("ghi", "H100", [4096, 8192])]
    assert tune._gpus(meta) == "H100 and H200"
    capsys.readouterr()


def test_tuner_times_only_the_programs_asked_for():
    from conv1d_silu.tune import _programs

    every = _programs("bwd_bias")  # the grid's x is channel-last: the channel-last programs
    assert every == [n for n, p in PROGRAMS.items() if p.direction == "bwd" and p.layout == "BLC"]
    assert "bwd_bcl" not in every
    assert _programs("bwd_bias", ["rowgroup", "rowgroup_8b", "fwd_rows"]) == ["rowgroup", "rowgroup_8b"]
    assert _programs("fwd", ["rowgroup", "fwd_rows"]) == ["fwd_rows"]


def test_tuner_rates_named_programs_against_the_routed_one_in_the_same_run():
    # programs timed in runs days apart differ by up to 6 % at a point on the H200
    import torch

    from conv1d_silu.routes import rule_for
    from conv1d_silu.tune import _programs, _timed

    routed = rule_for("sm_90", "bwd_bias", 4096, 1048576).program
    named = [p for p in _programs("bwd_bias") if p != routed][:2]
    assert _timed("bwd_bias", 4096, 1048576, 4, torch.bfloat16, named, "sm_90") == [*named, routed]
    assert _timed("bwd_bias", 4096, 1048576, 4, torch.bfloat16, [routed], "sm_90") == [routed]
    assert _timed("bwd_bias", 4096, 1048576, 4, torch.bfloat16, None, "sm_90") == _programs("bwd_bias")


def test_tuner_resamples_noisy_points_only():
    from conv1d_silu.tune import NOISE_CAP, settled

    calls = []

    def sampler(batches):
        def sample():
            calls.append(1)
            return batches[min(len(calls) - 1, len(batches) - 1)]
        return sample

    tight = [100.0, 100.5, 99.5, 100.2, 99.8]
    assert settled(sampler([tight])) == (100.0, pytest.approx(0.006, abs=1e-3)) and len(calls) == 1
    calls.clear()
    noisy = [100.0, 120.0, 80.0, 130.0, 70.0]
    med, spread = settled(sampler([noisy, tight, tight]))
    assert len(calls) == 3 and med == pytest.approx(100.0, abs=0.5) and spread <= NOISE_CAP
    calls.clear()
    assert settled(sampler([noisy]), rounds=1)[1] > NOISE_CAP and len(calls) == 2  # gives up after its rounds


def test_tuner_with_backward_programs_only_times_backward_variants(monkeypatch):
    """--programs of one direction: the other direction's variants are not measured (they have no
    program to time, and an empty point has no fastest)."""
    from conv1d_silu import bench, tune

    seen = []

    def fake_measure(variants, Cs, Ss, reps, programs=None):
        seen.extend(variants)
        return [tune.Measurement(v, C, S, {p: 1.0 for p in tune._programs(v, programs)},
                                 {p: 0.0 for p in tune._programs(v, programs)})
                for v in variants for C in Cs for S in Ss]

    monkeypatch.setattr(tune, "measure", fake_measure)
    monkeypatch.setattr(bench, "meta", lambda *a: {"arch": "sm_90"})
    monkeypatch.setattr(tune.ops, "_arch", lambda device: "sm_90")
    monkeypatch.setattr(tune.torch.cuda, "get_device_capability", lambda *a: (9, 0))
    tune.main(["--programs", "rowgroup_long16_8b", "--jobs", "0", "--no-write", "--C", "384", "--S", "131072"])
    assert seen and all(v.startswith("bwd") for v in seen)


def test_tuner_times_every_program_at_a_point(kernel_backend):
    """One measured point of the tuner (``tune._point``), through the real planning code on the
    emulator or the GPU: a time and a spread per program asked for."""
    import torch

    from conv1d_silu import ops
    from conv1d_silu.bench import Timer
    from conv1d_silu.routes import rule_for
    from conv1d_silu.tune import _point

    device = torch.device(kernel_backend.device)
    timer = Timer(device, reps=3, warmup=1, graph=False)
    m = _point("bwd_bias", 24, 300, 4, torch.float32, timer, ["rowgroup", "rowgroup_long_8b"])
    assert (m.variant, m.C, m.S) == ("bwd_bias", 24, 300)
    routed = rule_for(ops._arch(device), "bwd_bias", 24, 300, 4, "float32").program  # timed beside them
    assert set(m.times) == set(m.spread) == {"rowgroup", "rowgroup_long_8b", routed}
    assert all(t > 0 for t in m.times.values())


def test_tuner_evidence_header_names_its_runs(tmp_path):
    from conv1d_silu import tune
    from conv1d_silu.tune import Measurement

    ms = [Measurement("bwd", 256, 32768, {"rowgroup": 10.0, "rowgroup_8b": 8.0}, {"rowgroup": 0.01, "rowgroup_8b": 0.01})]
    meta = {"gpu": "H200", "torch": "2.x", "reps": 9, "commit": "abc", "date": "d",
            "parts": [{"commit": "abc", "date": "d", "variants": ["bwd"]}]}
    text = tune.write_evidence(tmp_path / "routes-sm_90.md", "sm_90", ms, tune.choose(ms), meta).read_text()
    header = text.splitlines()[2]
    assert "commits abc (bwd: d): bf16, K = 4, cold L2, median of 9 CUDA-graph replays" in header
    assert "{" not in header


# The route tables as package data


def test_shipped_tables_validate_and_are_the_routes():
    shipped = sorted(t.name for t in TABLES.glob("*.json"))
    assert shipped == ["sm_107a.json", "sm_90.json"]
    for table in TABLES.glob("*.json"):
        arch, table_routes = routes.load_table(table)
        assert table.name == f"{arch}.json" and table_routes == ROUTES[arch]
        raw = json.loads(table.read_text())
        assert "why" not in table.read_text()
        assert raw["measured"]["by"]
    measured = json.loads((TABLES / "sm_90.json").read_text())["measured"]
    assert measured == {"gpu": "NVIDIA H200", "by": "python -m conv1d_silu.tune", "dtype": "bfloat16", "K": 4,
                        "dates": "2026-12-04 to 2026-12-06",
                        "channel_first": "NVIDIA H100, python -m conv1d_silu.bench --layout BCL, 2026-12-08"}
    # archs without a file route every call to the defaults
    for arch in ("sm_100a", "sm_103a", "generic"):
        assert all(rules == (routes.default_rule(v),) for v, rules in ROUTES[arch].items())


def test_route_tables_round_trip_through_their_format():
    odd = {"bwd": [Rule("rowgroup_8b", 8, 16, 0, frozenset({"float16", "bfloat16"}), frozenset({2, 4}))]}
    for arch, table in [*ROUTES.items(), ("sm_100a", odd)]:
        if arch == "generic":
            continue
        text = routes.format_table(arch, {"by": "test"}, {v: list(rs) for v, rs in table.items()})
        parsed = routes.parse_table(json.loads(text), f"{arch}.json")
        assert parsed[0] == arch
        for variant, rules in parsed[1].items():
            want = tuple(table.get(variant, ()))
            want += () if want and want[-1].is_default else (routes.default_rule(variant),)
            assert rules == want, (arch, variant)


def _table(**routes_):
    return {"arch": "sm_90", "measured": {"by": "test"}, "routes": routes_}


GOOD = {"program": "rowgroup_8b", "c_lo": 256, "c_hi": 264, "s_min": 32768}


@pytest.mark.parametrize(
    "data,message",
    [
        (_table(bwd=[GOOD, {"program": "rowgroup_nope"}]), r"routes.bwd\[1\]: unknown program 'rowgroup_nope'"),
        (_table(bwd=[GOOD]), r"routes.bwd: no default"),
        (_table(bwd=[{"program": "rowgroup"}, GOOD]), r"routes.bwd\[0\] matches every call, so the rules after it"),
        (_table(bwd=[{**GOOD, "c_low": 256}, {"program": "rowgroup"}]), r"routes.bwd\[0\]: unknown keys \['c_low'\]"),
        (_table(bwd=[{"c_lo": 1}, {"program": "rowgroup"}]), r"routes.bwd\[0\]: no 'program'"),
        (_table(fwd=[GOOD, {"program": "fwd_rows"}]), r"routes.fwd\[0\]: 'rowgroup_8b' is a bwd program, in a fwd route"),
        (_table(fwd=[{"program": "fwd_rows_8b", "c_lo": 8}, {"program": "fwd_rows"}]), r"routes.fwd\[0\]: 'fwd_rows_8b' is never routed"),
        (_table(bwd=[{**GOOD, "c_hi": 256}, {"program": "rowgroup"}]), r"routes.bwd\[0\]: empty channel band c_lo = 256 >= c_hi = 256"),
        (_table(bwd=[{**GOOD, "s_min": "32768"}, {"program": "rowgroup"}]), r"routes.bwd\[0\]: s_min must be a non-negative integer, got '32768'"),
        (_table(bwd=[{**GOOD, "dtypes": ["bf16"]}, {"program": "rowgroup"}]), r"routes.bwd\[0\]: dtypes must be a non-empty list"),
        (_table(bwd=[{**GOOD, "ks": [0]}, {"program": "rowgroup"}]), r"routes.bwd\[0\]: ks must be a non-empty list"),
        (_table(bwd_nope=[{"program": "rowgroup"}]), r"unknown variant 'bwd_nope'"),
        (_table(bwd=[]), r"routes.bwd: expected a non-empty list"),
        ({**_table(), "arch": "hopper"}, r"arch 'hopper' is not a CUDA arch name"),
        ({**_table(), "why": "x"}, r"expected an object with the keys \['arch', 'measured', 'routes'\]"),
        ({"arch": "sm_90", "routes": {}}, r"expected an object with the keys"),
        ({**_table(), "arch": "sm_107a"}, r"holds the routes of 'sm_107a'; name it sm_107a.json"),
    ],
)
def test_a_broken_route_table_raises_an_error_naming_the_file(tmp_path, data, message):
    (tmp_path / "sm_90.json").write_text(json.dumps(data))
    with pytest.raises(RouteTableError, match=r"^route table \S*sm_90.json: " + message):
        routes.route_table(tmp_path)


def test_a_route_table_that_is_not_json_names_the_file(tmp_path):
    (tmp_path / "sm_90.json").write_text('{"arch": "sm_90",')
    with pytest.raises(RouteTableError, match=r"^route table \S*sm_90.json: not JSON"):
        routes.route_table(tmp_path)


def test_route_table_from_a_folder(tmp_path):
    assert routes.route_table(tmp_path)["sm_90"] == routes.route_table(tmp_path)["generic"]  # no files: defaults
    (tmp_path / "sm_100a.json").write_text(json.dumps({**_table(bwd=[GOOD, {"program": "rowgroup"}]), "arch": "sm_100a"}))
    table = routes.route_table(tmp_path)
    assert table["sm_100a"]["bwd"] == (Rule("rowgroup_8b", 256, 264, 32768), routes.BWD_DEFAULT)
    assert table["sm_100a"]["fwd"] == (routes.FWD_DEFAULT,)


def test_rule_conditions_in_words():
    assert Rule("rowgroup_sm", 264, 296, 32768).condition == "264 <= C < 296, S >= 32768"
    assert Rule("rowgroup_8b", 4096, INF, 0, frozenset({"bfloat16"}), frozenset({4})).condition == (
        "4096 <= C, dtype in ['bfloat16'], K in [4]")
    assert routes.BWD_DEFAULT.condition == "every call"


# The tuner's files


def _dump(path, arch="sm_90"):
    """A tiny --json dump: rowgroup_8b beats the default at C = 264 from 65536 tokens."""
    ms = []
    for C in (256, 264):
        for S in (32768, 65536):
            t = {"rowgroup": 100.0, "rowgroup_8b": 60.0 if (C, S) == (264, 65536) else 101.0}
            ms.append({"variant": "bwd", "C": C, "S": S, "times": t, "spread": {p: 0.01 for p in t}})
    meta = {"arch": arch, "gpu": "NVIDIA H200", "torch": "2.x", "reps": 9, "commit": "abc",
            "date": "2026-12-06 01:02:03"}
    path.write_text(json.dumps({"meta": meta, "measurements": ms}))
    return path


def _package_files():
    return {p.name: p.read_bytes() for p in TABLES.iterdir()}


def test_tuner_out_writes_the_table_and_evidence_and_never_the_package(tmp_path, monkeypatch, capsys):
    from conv1d_silu import tune

    dump = _dump(tmp_path / "tune.json")
    before = _package_files()
    tune.main(["--from-json", str(dump), "--out", str(tmp_path / "out")])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["routes-sm_90.md", "sm_90.json"]
    arch, table = routes.load_table(tmp_path / "out" / "sm_90.json")
    assert arch == "sm_90"
    # the package table's channel-first rules come first, as they were (the tuner times channel-last
    # programs only), and so does what its "measured" block says of them
    package = json.loads((TABLES / "sm_90.json").read_text())
    channel_first = tuple(r for r in routes.ROUTES["sm_90"]["bwd"] if routes.PROGRAMS[r.program].layout == "BCL")
    assert channel_first and "bwd_bcl_chain2" in {r.program for r in channel_first}
    assert table["bwd"] == (*channel_first, Rule("rowgroup_8b", 264, INF, 46340), routes.BWD_DEFAULT)
    assert table["bwd_bias"] == (*channel_first, routes.BWD_DEFAULT)  # not measured: its channel-first rules kept
    assert table["fwd"] == (routes.FWD_DEFAULT,)  # not measured: the default
    raw = json.loads((tmp_path / "out" / "sm_90.json").read_text())
    assert raw["measured"] == {"gpu": "NVIDIA H200", "by": "python -m conv1d_silu.tune", "dtype": "bfloat16",
                               "K": 4, "dates": "2026-12-06", "channel_first": package["measured"]["channel_first"]}
    assert "abc" not in (tmp_path / "out" / "sm_90.json").read_text()  # no commit in a table
    evidence = (tmp_path / "out" / "routes-sm_90.md").read_text()
    assert "| 65536 | 264 | 100.0 | **60.0** | rowgroup_8b |" in evidence
    assert "| 32768 | 264 | **100.0** | 101.0 | rowgroup |" in evidence
    # without --out: ./tune-<arch>/ in the current directory
    monkeypatch.chdir(tmp_path)
    tune.main(["--from-json", str(dump)])
    assert (tmp_path / "tune-sm_90" / "sm_90.json").read_text() == (tmp_path / "out" / "sm_90.json").read_text()
    assert _package_files() == before
    capsys.readouterr()


def test_tuner_writes_the_package_only_in_a_source_checkout(tmp_path, monkeypatch, capsys):
    from conv1d_silu import tune

    dump = _dump(tmp_path / "tune.json")
    installed = tmp_path / "lib" / "python3.12" / "site-packages" / "conv1d_silu"
    (installed / "route_tables").mkdir(parents=True)
    (tmp_path / "lib" / "python3.12" / "site-packages" / "pyproject.toml").write_text("")
    monkeypatch.setattr(tune, "PACKAGE", installed)
    with pytest.raises(SystemExit, match="not a writable source checkout: it lies under site-packages"):
        tune.main(["--from-json", str(dump), "--out", str(tmp_path / "out"), "--write-package"])
    assert not (tmp_path / "out").exists() and not list((installed / "route_tables").iterdir())  # refused first
    loose = tmp_path / "loose" / "conv1d_silu"
    (loose / "route_tables").mkdir(parents=True)
    monkeypatch.setattr(tune, "PACKAGE", loose)
    with pytest.raises(SystemExit, match="pyproject.toml does not exist"):
        tune.main(["--from-json", str(dump), "--out", str(tmp_path / "out"), "--write-package"])
    # a checkout: the package's table is written too, the same as OUT's
    checkout = tmp_path / "checkout" / "conv1d_silu"
    (checkout / "route_tables").mkdir(parents=True)
    (checkout.parent / "pyproject.toml").write_text("")
    monkeypatch.setattr(tune, "PACKAGE", checkout)
    tune.main(["--from-json", str(dump), "--out", str(tmp_path / "out"), "--write-package"])
    written = (checkout / "route_tables" / "sm_90.json").read_text()
    assert written == (tmp_path / "out" / "sm_90.json").read_text()
    assert sorted(p.name for p in (checkout / "route_tables").iterdir()) == ["sm_90.json"]  # no evidence there
    capsys.readouterr()


def test_retuning_keeps_the_channel_first_rules_once(tmp_path, monkeypatch, capsys):
    """The tuner times channel-last programs only: writing a checkout's table again and again keeps
    its channel-first rules (once, first in their variants) and what its "measured" block says of
    them, and a table for an arch without one gets none."""
    from conv1d_silu import tune

    checkout = tmp_path / "checkout" / "conv1d_silu"
    (checkout / "route_tables").mkdir(parents=True)
    (checkout.parent / "pyproject.toml").write_text("")
    (checkout / "route_tables" / "sm_90.json").write_text((TABLES / "sm_90.json").read_text())
    monkeypatch.setattr(tune, "PACKAGE", checkout)
    dump = _dump(tmp_path / "tune.json")
    for _ in range(2):
        tune.main(["--from-json", str(dump), "--out", str(checkout / "route_tables"), "--write-package"])
    raw = json.loads((checkout / "route_tables" / "sm_90.json").read_text())
    assert raw["measured"]["channel_first"] == json.loads((TABLES / "sm_90.json").read_text())["measured"]["channel_first"]
    _, table = routes.load_table(checkout / "route_tables" / "sm_90.json")
    for variant in VARIANTS:
        kept = [r for r in table[variant] if PROGRAMS[r.program].layout == "BCL"]
        assert kept == [r for r in ROUTES["sm_90"][variant] if PROGRAMS[r.program].layout == "BCL"], variant
        assert table[variant][: len(kept)] == tuple(kept) and table[variant][-1] == routes.default_rule(variant)
    assert table["bwd"][len(kept) :] == (Rule("rowgroup_8b", 264, INF, 46340), routes.BWD_DEFAULT)
    tune.main(["--from-json", str(_dump(tmp_path / "t100.json", arch="sm_100a")), "--out", str(tmp_path / "o100")])
    raw = json.loads((tmp_path / "o100" / "sm_100a.json").read_text())
    assert "channel_first" not in raw["measured"] and "bwd_bcl" not in json.dumps(raw["routes"])
    capsys.readouterr()


def test_a_channel_first_rule_that_matches_everything_is_no_default():
    """format_table appends the channel-last default after a bare channel-first rule, since that rule
    catches no channel-last call."""
    text = routes.format_table("sm_90", {}, {"bwd": [Rule("bwd_bcl")]})
    _, table = routes.parse_table(json.loads(text), "t")
    assert table["bwd"] == (Rule("bwd_bcl"), routes.BWD_DEFAULT)


def test_tuner_help_says_where_files_go(capsys):
    from conv1d_silu import tune

    with pytest.raises(SystemExit):
        tune.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("OUT/<arch>.json", "OUT/routes-<arch>.md", "./tune-<arch>/", "never written unless --write-package",
                  "conv1d_silu/route_tables/<arch>.json", "--from-json tune.json --out DIR"):
        assert words in text, words


def test_channel_first_calls_route_to_their_layout():
    """A route's rules name programs of either layout; a call takes the first matching rule of its
    x's layout, else that layout's default."""
    for variant in ("fwd", "fwd_dt", "bwd_bias", "bwd_fp32g"):
        program = select("sm_90", variant, 1024, 65536, 4, "bfloat16", "BCL")
        assert program.layout == "BCL" and program.direction == variant[:3]
        assert select("sm_90", variant, 1024, 65536).layout == "BLC"
    with pytest.raises(RouteTableError, match="no default"):  # a channel-first rule catches no channel-last call
        routes.parse_table({"arch": "sm_90", "measured": {}, "routes": {"fwd": [{"program": "fwd_bcl"}]}}, "t")
    _, table = routes.parse_table(
        {"arch": "sm_90", "measured": {}, "routes": {"fwd": [{"program": "fwd_bcl", "c_lo": 64}, {"program": "fwd_rows"}]}},
        "t",
    )
    assert [r.program for r in table["fwd"]] == ["fwd_bcl", "fwd_rows"]


def test_the_channel_first_backward_takes_the_chained_round_where_it_was_faster():
    """The sm_90 table's channel-first backward rules: the chained round where it beat the staged
    walk on the H100 (16384 tokens at C >= 1024, 32768 at C < 2048; 16-bit x, a slab over two lanes),
    the staged walk elsewhere; calls with document tables keep the walk (the chained round is the
    simple walk's), and so does wider x, whose slabs span four or eight lanes."""
    cases = [(1024, 16384, "bwd_bcl_chain2"), (5120, 16384, "bwd_bcl_chain2"), (1024, 32768, "bwd_bcl_chain2"),
             (2560, 32768, "bwd_bcl"), (1024, 65536, "bwd_bcl"), (256, 16384, "bwd_bcl"), (2560, 8192, "bwd_bcl")]
    for variant in ("bwd", "bwd_bias", "bwd_fp32g", "bwd_bias_fp32g"):
        for C, S, want in cases:
            assert select("sm_90", variant, C, S, 4, "bfloat16", "BCL").name == want, (variant, C, S)
    assert select("sm_90", "bwd_dt", 2560, 16384, 4, "bfloat16", "BCL").name == "bwd_bcl"
    assert select("sm_90", "bwd", 2560, 16384, 4, "float16", "BCL").name == "bwd_bcl_chain2"
    assert select("sm_90", "bwd", 2560, 16384, 4, "float32", "BCL").name == "bwd_bcl"
