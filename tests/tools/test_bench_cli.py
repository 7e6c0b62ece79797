"""The benchmark helpers (row schema, merge, plan, tables) and the command line; CPU only, fast."""
from __future__ import annotations

import json
import os
import sys
import types

import pytest
import torch

from flashattn import cli

bench = cli.load_bench()

ENV = {"date": "2026-11-22", "torch": "2.11.0", "triton": "3.6.0", "gpu": "NVIDIA H100 80GB HBM3"}
SCHEMA = {"impl", "mode", "d", "causal", "s", "b", "h", "ms", "date", "torch", "triton", "gpu"}


def row(impl="flashattn", mode="fwd", d=128, causal=False, s=2048, value=100.0, **kw):
    b, h = bench.grid_shape(s, d)
    return bench.make_row(impl, mode, d, causal, s, b, h, value=value, ms=1.0, env=ENV, **kw)


# ------------------------------------------------------------------------------------ helpers
@pytest.mark.parametrize("text,value", [("512", 512), ("2k", 2048), ("16K", 16384),
                                        ("1m", 1 << 20), (" 4k ", 4096), ("0.5k", 512)])
def test_parse_seqlen(text, value):
    assert bench.parse_seqlen(text) == value
    assert cli._seqlen(text) == value


@pytest.mark.parametrize("text", ["", "k", "2x", "-1", "1.3"])
def test_parse_seqlen_rejects(text):
    with pytest.raises(ValueError):
        bench.parse_seqlen(text)
    with pytest.raises(ValueError):
        cli._seqlen(text)


def test_format_seqlen():
    assert [bench.format_seqlen(s) for s in (512, 1024, 16384, 131072, 1000)] == \
        ["512", "1k", "16k", "128k", "1000"]


def test_grid_shape_is_16k_tokens_hidden_2048():
    for d in (64, 128, 256):
        for s in bench.SEQLENS:
            b, h = bench.grid_shape(s, d)
            assert b * s == 16384 and h * d == 2048


def test_flops():
    f = bench.attn_flops("fwd", 1, 16384, 16, 128, False)
    assert f == 4 * 16384**2 * 16 * 128
    assert bench.attn_flops("fwd", 1, 16384, 16, 128, True) == f / 2
    assert bench.attn_flops("bwd", 1, 16384, 16, 128, False) == 2.5 * f
    assert bench.attn_flops("bwd", 1, 16384, 16, 128, True) == 1.25 * f


def test_decode_bytes():
    # b=1, 16k cache, 8 kv heads of 128, bf16: K and V
    assert bench.decode_bytes(1, 16384) == 2 * 16384 * 8 * 128 * 2


@pytest.mark.parametrize("name,slug", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                       ("NVIDIA GeForce RTX 4090", "rtx4090"),
                                       ("NVIDIA A100-SXM4-80GB", "a100"), ("cpu", "cpu"),
                                       ("Weird GPU/9000", "weird-gpu-9000")])
def test_gpu_slug(name, slug):
    assert bench.gpu_slug(name) == slug


# ------------------------------------------------------------------------------------ rows
def test_row_schema():
    r = row()
    assert set(r) == SCHEMA | {"tflops"}
    assert r["b"] == 8 and r["h"] == 16 and r["tflops"] == 100.0
    dec = row(mode="decode", s=16384, value=2.5)
    assert set(dec) == SCHEMA | {"tbps"}
    mem = row(mode="mem", value=129.0)
    assert set(mem) == SCHEMA | {"mib"}
    err = row(value=None, error="RuntimeError: no kernel")
    assert set(err) == SCHEMA | {"tflops", "error"} and err["tflops"] is None
    json.dumps([r, dec, mem, err])  # plain JSON types only


def test_merge_replaces_same_key_and_appends_new():
    old = [row(s=2048, value=1.0), row(s=4096, value=2.0), row(impl="sdpa-flash", value=3.0)]
    new = [row(s=4096, value=20.0), row(s=8192, value=30.0), row(s=2048, causal=True, value=4.0)]
    merged = bench.merge_rows(old, new)
    assert [bench.row_value(r) for r in merged] == [1.0, 20.0, 3.0, 30.0, 4.0]
    assert len({bench.row_key(r) for r in merged}) == len(merged)
    assert bench.merge_rows(merged, new) == merged  # idempotent
    # a different date/version does not make a different key
    assert len(bench.merge_rows(old, [dict(old[0], date="2030-01-01")])) == len(old)


def test_save_and_load_merge(tmp_path):
    path = tmp_path / "results" / "h100.json"
    assert bench.load_rows(path) == []
    bench.save_rows(path, [row(s=2048, value=1.0), row(s=4096, value=2.0)])
    bench.save_rows(path, [row(s=4096, value=5.0)])
    data = json.loads(path.read_text())
    assert list(data) == ["rows"]
    assert [(r["s"], r["tflops"]) for r in data["rows"]] == [(2048, 1.0), (4096, 5.0)]
    bench.save_rows(path, [row(s=512, value=7.0)], merge=False)
    assert [r["s"] for r in bench.load_rows(path)] == [512]


# ------------------------------------------------------------------------------------ plan
def test_plan_full_grid():
    pairs = bench.plan()
    attn = [(p, i) for p, i in pairs]
    # 3 d x 2 causal x 6 s x 2 modes x 4 impls (fa4 among them), plus flex at d=128 only
    assert len(attn) == 3 * 2 * 6 * 2 * 4 + 2 * 6 * 2
    assert {p.d for p, i in pairs if i == "fa4"} == {64, 128, 256}
    assert {p.d for p, i in pairs if i == "flex"} == {128}
    assert len(set(pairs)) == len(pairs)
    assert all(p.b * p.s == 16384 and p.h * p.d == 2048 for p, _ in pairs)


def test_plan_decode_and_mem():
    pairs = bench.plan(modes=("decode", "mem"))
    dec = [(p, i) for p, i in pairs if p.mode == "decode"]
    assert {(p.b, p.s) for p, _ in dec} == set(bench.DECODE_POINTS)
    assert all(p.h == 32 and p.d == 128 for p, _ in dec)
    assert not {"flex", "fa4"} & {i for _, i in dec}
    mem = [(p, i) for p, i in pairs if p.mode == "mem"]
    assert "fa4" in {i for _, i in mem}
    assert {p.s for p, _ in mem} == {4096, 16384, 65536}
    assert "sdpa-math" in {i for _, i in mem}
    assert all((p.b, p.h, p.d, p.causal) == (1, 16, 128, True) for p, _ in mem)


def test_plan_flex_all_d_and_errors():
    pairs = bench.plan(impls=("flex",), flex_all_d=True, seqlens=(2048,))
    assert {p.d for p, _ in pairs} == {64, 128, 256}
    with pytest.raises(ValueError, match="unknown impl"):
        bench.plan(impls=("sdpa-fast",))
    with pytest.raises(ValueError, match="unknown mode"):
        bench.plan(modes=("fwd", "train"))
    assert bench.check_impl("flashattn-portable") == "flashattn-portable"


# ------------------------------------------------------------------------------------ tables
def test_summary_ratio_to_best_anchor():
    rows = [row(value=300.0), row(impl="sdpa-flash", value=200.0), row(impl="sdpa-cudnn", value=250.0),
            row(impl="flex", value=None, error="boom"),
            row(mode="mem", impl="flashattn", value=100.0), row(mode="mem", impl="sdpa-flash", value=80.0),
            row(mode="mem", impl="sdpa-math", value=4000.0)]
    tables = {title.split()[0]: (headers, lines) for title, headers, lines in bench.summary_tables(rows)}
    headers, lines = tables["fwd"]
    assert headers[5] == "flashattn"
    cells = dict(zip(headers, lines[0]))
    assert cells["flex"] == "err" and cells["flashattn/best anchor"] == "1.20x"
    headers, lines = tables["mem"]
    # lower is better for memory, and the naive row is not an anchor
    assert dict(zip(headers, lines[0]))["flashattn/best anchor"] == "1.25x"
    text = bench.render_tables(rows)
    assert "errors" in text and "boom" in text


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [row(s=s, impl=i, value=float(s) / 100 + k, causal=c, mode=m)
            for s in (1024, 2048) for k, i in enumerate(("flashattn", "sdpa-flash"))
            for c in (False, True) for m in ("fwd", "bwd")]
    rows.append(row(mode="decode", s=16384, value=2.0))
    out = bench.plot(rows, tmp_path / "p.png")
    assert out.stat().st_size > 1000


# ------------------------------------------------------------------------------------ runner
def test_run_on_cpu_rows_and_error_rows(tmp_path):
    """The runner end to end on CPU (wall-clock timing): our cpu path, SDPA math, and an anchor
    that cannot run here (cuDNN) recorded as an error row instead of stopping the run."""
    point = bench.Point("fwd", 16, True, 64, 1, 2)
    bwd = bench.Point("bwd", 16, False, 48, 1, 2)
    pairs = [(point, "flashattn-cpu"), (point, "sdpa-math"), (point, "sdpa-cudnn"),
             (bwd, "flashattn-cpu"), (bwd, "sdpa-math")]
    seen = []
    path = tmp_path / "r.json"
    rows, skipped = bench.run(pairs, timing=bench.Timing(0, 1), progress=False, device="cpu",
                              on_row=lambda r: (seen.append(r), bench.save_rows(path, [r])))
    assert skipped == 0 and rows == seen and len(rows) == 5
    by = {(r["mode"], r["impl"]): r for r in rows}
    assert by[("fwd", "sdpa-cudnn")]["error"] and by[("fwd", "sdpa-cudnn")]["tflops"] is None
    for key in [("fwd", "flashattn-cpu"), ("fwd", "sdpa-math"), ("bwd", "flashattn-cpu"),
                ("bwd", "sdpa-math")]:
        assert "error" not in by[key], by[key]
        assert by[key]["tflops"] > 0 and by[key]["ms"] > 0
    assert len(bench.load_rows(path)) == 5


def test_run_rounds_interleave_and_keep_the_best(monkeypatch):
    """--rounds: every implementation of a point once per round, the order reversed every
    other round; a pair's row is its fastest round (mem: its smallest), with every round's
    value; a pair whose every round failed keeps an error row."""
    point = bench.Point("fwd", 16, False, 32, 1, 1)
    mem = bench.Point("mem", 16, False, 32, 1, 1)
    order = []
    values = {("fwd", "a"): [5.0, 7.0, 6.0], ("fwd", "b"): [3.0, 2.0, 4.0],
              ("mem", "a"): [9.0, 8.0, 10.0]}

    def fake_measure(point, impl, timing, env, device):
        order.append((point.mode, impl))
        if impl == "broken":
            return bench.make_row(impl, point.mode, point.d, point.causal, point.s, point.b,
                                  point.h, value=None, ms=None, env=env, error="boom")
        v = values[(point.mode, impl)][sum(o == (point.mode, impl) for o in order) - 1]
        return bench.make_row(impl, point.mode, point.d, point.causal, point.s, point.b,
                              point.h, value=v, ms=1.0 / v, env=env)

    monkeypatch.setattr(bench, "measure", fake_measure)
    pairs = [(point, "a"), (point, "b"), (point, "broken"), (mem, "a")]
    rows, skipped = bench.run(pairs, timing=bench.Timing(0, 1), progress=False, device="cpu",
                              rounds=3)
    assert skipped == 0 and len(rows) == 4
    assert order[:9] == [("fwd", "a"), ("fwd", "b"), ("fwd", "broken"),
                         ("fwd", "broken"), ("fwd", "b"), ("fwd", "a"),
                         ("fwd", "a"), ("fwd", "b"), ("fwd", "broken")]
    by = {(r["mode"], r["impl"]): r for r in rows}
    assert by[("fwd", "a")]["tflops"] == 7.0 and by[("fwd", "a")]["rounds"] == [5.0, 7.0, 6.0]
    assert by[("fwd", "b")]["tflops"] == 4.0
    assert by[("fwd", "broken")]["error"] == "boom"
    assert by[("mem", "a")]["mib"] == 8.0
    with pytest.raises(ValueError, match="rounds"):
        bench.run(pairs, timing=bench.Timing(0, 1), progress=False, device="cpu", rounds=0)


def test_run_interrupted_keeps_what_the_point_in_hand_measured(monkeypatch):
    """Ctrl-C in the middle of a point's implementations: the ones it measured keep their
    rows (the incremental save sees them), the rest count as not run."""
    point = bench.Point("fwd", 16, False, 32, 1, 1)
    calls = []

    def fake_measure(point, impl, timing, env, device):
        calls.append(impl)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return bench.make_row(impl, point.mode, point.d, point.causal, point.s, point.b,
                              point.h, value=1.0, ms=1.0, env=env)

    monkeypatch.setattr(bench, "measure", fake_measure)
    saved = []
    rows, skipped = bench.run([(point, "a"), (point, "b"), (point, "c")],
                              timing=bench.Timing(0, 1), progress=False, device="cpu",
                              on_row=saved.append)
    assert [r["impl"] for r in rows] == ["a"] and saved == rows and skipped == 2


def test_run_time_budget_skips():
    point = bench.Point("fwd", 16, False, 32, 1, 1)
    rows, skipped = bench.run([(point, "sdpa-math")] * 3, timing=bench.Timing(0, 1),
                              time_budget_s=-1.0, progress=False, device="cpu")
    assert rows == [] and skipped == 3


# ------------------------------------------------------------------------------------ fa4
# FlashAttention-4 (flash_attn.cute) is never installed on these CPU machines: its absence is
# made certain with a None entry in sys.modules, and its presence is a fake package whose
# flash_attn_func computes attention with torch (returning a tuple, or a bare tensor as some
# releases did), so the call adapter and the runner run end to end on CPU.
@pytest.fixture
def no_fa4(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)


def _sdpa_bshd(q, k, v, softmax_scale=None, causal=False):
    import torch.nn.functional as F

    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=causal, scale=softmax_scale)
    return out.transpose(1, 2)


@pytest.fixture
def fake_fa4(monkeypatch):
    """Installs a fake flash_attn.cute; returns the list of calls (kwargs) it saw. Set
    ``calls.bare = True`` to make it return the output alone."""
    class Calls(list):
        bare = False

    calls = Calls()

    def flash_attn_func(q, k, v, qv=None, softmax_scale=None, causal=False, **kwargs):
        calls.append(dict(softmax_scale=softmax_scale, causal=causal, **kwargs))
        out = _sdpa_bshd(q, k, v, softmax_scale=softmax_scale, causal=causal)
        if calls.bare:
            return out
        lse = out.new_zeros(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
        return out, lse

    pkg = types.ModuleType("flash_attn")
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = flash_attn_func
    pkg.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    return calls


def test_fa4_parses_and_is_a_default_anchor():
    assert bench.check_impl("fa4") == "fa4" and "fa4" in bench.VALID_IMPLS
    assert "fa4" in bench.DEFAULT_IMPLS and not bench.is_ours("fa4")
    args = cli.build_parser().parse_args(["bench", "--impl", "flashattn,fa4,sdpa-cudnn"])
    assert args.impl == ["flashattn", "fa4", "sdpa-cudnn"]
    assert "fa4" in cli.build_parser()._subparsers._group_actions[0].choices["bench"].format_help()


def test_fa4_absent_is_dropped_with_one_line(no_fa4, capsys):
    """No flash_attn.cute: one line on stderr naming fa4 and why, no rows for it (no error row
    per point either, which would overwrite measured fa4 rows when merged), the rest runs."""
    assert bench.fa4_unavailable().startswith("flash_attn.cute does not import")
    point, bwd = bench.Point("fwd", 16, True, 64, 1, 2), bench.Point("bwd", 16, False, 48, 1, 2)
    pairs = [(point, "sdpa-math"), (point, "fa4"), (bwd, "fa4"), (bwd, "sdpa-math")]
    rows, skipped = bench.run(pairs, timing=bench.Timing(0, 1), progress=False, device="cpu")
    assert skipped == 0 and [r["impl"] for r in rows] == ["sdpa-math", "sdpa-math"]
    assert all("error" not in r for r in rows)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench: fa4 skipped (2 measurements): "), err
    assert "Traceback" not in err[0]
    said = []
    assert bench.drop_unavailable(pairs, say=said.append) == [pairs[0], pairs[3]]
    assert len(said) == 1
    assert bench.drop_unavailable(pairs[:1], say=said.append) == pairs[:1] and len(said) == 1


def test_fa4_absent_gpu_command_line_says_one_line(no_fa4, monkeypatch, capsys):
    """`flashattn bench` on a GPU machine without flash-attn-4 (stand-in: CUDA reported present,
    the runner stubbed): the default set names fa4, one line says it is skipped, the count and
    the runner see the rest only."""
    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "environment", lambda: ENV)
    monkeypatch.setattr(bench, "run", lambda pairs, **kw: (seen.extend(pairs), ([], 0))[1])
    assert cli.main(["bench", "--quick", "--no-save", "--mode", "fwd", "--causal"]) == 0
    err = capsys.readouterr().err
    assert sum("fa4 skipped" in line for line in err.splitlines()) == 1, err
    assert seen and "fa4" not in {i for _, i in seen}
    assert f"bench: {len(seen)} measurements" in err


@pytest.mark.parametrize("bare", [False, True])
def test_fa4_adapter_tuple_or_tensor(fake_fa4, bare):
    """The fa4 callable returns the attention output whether flash_attn_func gives (out, lse)
    or out alone, with the default softmax scale and the point's causal flag, on the (b, s, h, d)
    tensors themselves; its backward is the graph of that same call."""
    fake_fa4.bare = bare
    assert bench.fa4_unavailable() is None
    q, k, v = (torch.randn(1, 40, 2, 16, requires_grad=True) for _ in range(3))
    inputs, fn = bench.build_attention("fa4", q, k, v, causal=True)
    assert inputs[0] is q and inputs[1] is k and inputs[2] is v
    out = fn(*inputs)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    torch.testing.assert_close(out, _sdpa_bshd(q, k, v, causal=True))
    assert fake_fa4 == [dict(softmax_scale=None, causal=True)]
    dq, dk, dv = torch.autograd.grad(out, inputs, torch.randn_like(out))
    assert dq.shape == q.shape and dk.abs().sum() > 0


def test_fa4_runs_in_the_grid_with_the_fake(fake_fa4):
    """fwd and bwd rows of fa4 beside ours through the runner (wall-clock timing on CPU);
    a head dim FA4's sm90 kernels refuse is an error row, as for any unsupported point."""
    point, bwd = bench.Point("fwd", 16, True, 64, 1, 2), bench.Point("bwd", 16, False, 48, 1, 2)
    odd = bench.Point("fwd", 12, False, 32, 1, 2)
    pairs = [(point, "flashattn-cpu"), (point, "fa4"), (bwd, "flashattn-cpu"), (bwd, "fa4"),
             (odd, "fa4")]
    rows, _ = bench.run(pairs, timing=bench.Timing(0, 1), progress=False, device="cpu")
    by = {(r["mode"], r["d"], r["impl"]): r for r in rows}
    for key in [("fwd", 16, "fa4"), ("bwd", 16, "fa4"), ("fwd", 16, "flashattn-cpu")]:
        assert "error" not in by[key], by[key]
        assert by[key]["tflops"] > 0
    assert by[("fwd", 12, "fa4")]["tflops"] is None
    assert "NotImplementedError" in by[("fwd", 12, "fa4")]["error"]
    assert {c["causal"] for c in fake_fa4} == {True, False}
    tables = {t.split()[0]: (h, lines) for t, h, lines in bench.summary_tables(rows)}
    assert "fa4" in tables["fwd"][0]  # an anchor column: ours/best anchor counts it


def test_fa4_head_dims():
    assert all(bench.fa4_unsupported(d) is None for d in (8, 64, 96, 128, 192, 256))
    for d in (4, 12, 264, 512):
        assert "fa4" in bench.fa4_unsupported(d) and str(d) in bench.fa4_unsupported(d)


def test_first_output():
    assert bench.first_output(("o", "lse")) == "o"
    assert bench.first_output(["o"]) == "o"
    assert bench.first_output("o") == "o"


# ------------------------------------------------------------------------------------ CLI
def test_cli_bench_arguments():
    args = cli.build_parser().parse_args(
        ["bench", "--d", "64,128", "--no-causal", "--seqlens", "2k,16k", "--mode", "fwd,bwd,decode",
         "--impl", "flashattn,sdpa-flash", "--json", "x.json", "--plot", "p.png", "--quick"])
    assert args.d == [64, 128] and args.causal is False and args.seqlens == [2048, 16384]
    assert args.mode == ["fwd", "bwd", "decode"] and args.impl == ["flashattn", "sdpa-flash"]
    assert args.json == "x.json" and args.plot == "p.png" and args.quick
    cfg = cli._bench_config(args, bench)
    assert cfg["causals"] == [False] and cfg["head_dims"] == [64, 128]
    assert cfg["timing"].rep_ms == 30


def test_cli_bench_defaults():
    args = cli.build_parser().parse_args(["bench"])
    cfg = cli._bench_config(args, bench)
    assert cfg["causals"] == [False, True] and cfg["modes"] == ["fwd", "bwd"]
    assert cfg["head_dims"] == [128, 64, 256] and cfg["seqlens"] == list(bench.SEQLENS)
    assert cfg["impls"] == ["flashattn", "sdpa-flash", "sdpa-cudnn", "flex", "fa4"]
    assert (cfg["timing"].warmup_ms, cfg["timing"].rep_ms) == (25, 100)
    quick = cli._bench_config(cli.build_parser().parse_args(["bench", "--quick", "--causal"]), bench)
    assert quick["head_dims"] == [128] and quick["seqlens"] == [2048, 16384]
    assert quick["causals"] == [True]


@pytest.mark.parametrize("argv", [["bench", "--mode", "fwd,train"], ["bench", "--seqlens", "2x"],
                                  ["bench", "--d", "a"], ["check", "--dtype", "int8"], ["nope"], []])
def test_cli_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(argv)
    assert exc.value.code == 2


def test_cli_report_only(tmp_path, capsys):
    path = tmp_path / "h100.json"
    bench.save_rows(path, [row(value=300.0), row(impl="sdpa-flash", value=200.0)])
    assert cli.main(["bench", "--report-only", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "fwd (TFLOP/s)" in out and "1.50x" in out


def test_cli_info(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "triton" in out and "backend dispatch" in out


def test_format_table_alignment():
    text = cli.format_table(["name", "value"], [["a", "1.5"], ["bb", "10.25"]])
    lines = text.splitlines()
    assert lines[2] == "a       1.5" and lines[3] == "bb    10.25"


# ------------------------------------------------------------------------------------ check
def test_check_passes_on_cpu_path(capsys):
    assert cli.main(["check", "--device", "cpu", "--backend", "cpu", "--dtype", "fp32",
                     "-k", "causal"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "0 failed" in out


def test_check_header_names_the_kernel_family(monkeypatch, capsys):
    """On a device whose dense calls start from another kernel family than its backend (sm90:
    the Gluon kernels, portable for the rest) the header says both; stand-in: the family of
    the device (not of the tensors the cases make) reported as 'hopper' on the CPU."""
    import torch

    from flashattn.dispatch import select as dispatch_select

    real = dispatch_select.family_for
    monkeypatch.setattr(dispatch_select, "family_for",
                        lambda x: "hopper" if isinstance(x, torch.device) else real(x))
    assert cli.main(["check", "--device", "cpu", "--backend", "cpu", "--dtype", "fp32",
                     "-k", "basic"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "backend cpu (hopper kernels where they cover the call)" in head


@pytest.mark.parametrize("dtype,factor", [("fp32", 1.001), ("bf16", 1.1)])
def test_check_catches_a_wrong_answer(monkeypatch, dtype, factor):
    import flashattn
    from flashattn import check as sc

    real = flashattn.flash_attn_func

    def off_by_a_bit(*args, **kwargs):
        res = real(*args, **kwargs)
        if isinstance(res, tuple):
            return (res[0] * factor,) + tuple(res[1:])
        return res * factor

    case = sc.Case("basic", b=1, s_q=40, s_k=40, h=2, h_k=2, d=16)
    with sc.forced_backend("cpu"):
        assert sc.run_case(case, dtype, "cpu").status == "PASS"
        monkeypatch.setattr(flashattn, "flash_attn_func", off_by_a_bit)
        assert sc.run_case(case, dtype, "cpu").status == "FAIL"


@pytest.mark.parametrize("entry,target", [("fa3", "dense"), ("quantized", "attention"),
                                          ("e2e", "flash_attn_fp8_func")])
def test_fp8_check_catches_a_wrong_answer(monkeypatch, entry, target):
    """The FP8 cases pass on the exact CPU path and fail when an entry point's output is 10 %
    off (FA3's rule allows twice what rounding P to e4m3 costs the oracle: a few % at 40
    keys) or when its LSE moves by 0.1."""
    from flashattn import check as sc
    from flashattn import fp8
    from flashattn.api import fp8_attention

    module = fp8_attention if entry == "fa3" else fp8
    real = getattr(module, target)
    case = sc.Case("fp8", b=1, s_q=40, s_k=40, h=4, h_k=2, d=32, causal=True, kind="fp8",
                   entry=entry)
    with sc.forced_backend("cpu"):
        assert sc.run_case(case, "fp8", "cpu").status == "PASS"
        for scale, shift in ((1.1, 0.0), (1.0, 0.1)):
            def off(*args, scale=scale, shift=shift, **kwargs):
                out, lse = real(*args, **kwargs)
                return out * scale, lse + shift

            monkeypatch.setattr(module, target, off)
            assert sc.run_case(case, "fp8", "cpu").status == "FAIL", (scale, shift)
            monkeypatch.setattr(module, target, real)


def test_memory_meter_sees_naive_scores():
    from flashattn import check as sc

    if not sc._PeakRSS().ok:
        pytest.skip("needs Linux /proc")
    with sc.forced_backend("cpu"):
        (r,) = sc.memory_rows([1024], h=1, d=16)
    scores_mib = 1024 * 1024 * 4 / 2**20
    assert r.naive_mib >= scores_mib  # at least the (s, s) fp32 scores
    assert r.ours_mib < r.naive_mib


def test_bench_ships_in_the_package():
    """`python -m flashattn bench` needs no repository checkout: the grid is a module of the
    package (an installed wheel has it), loaded by import, not by file path."""
    import flashattn.bench

    assert cli.load_bench() is flashattn.bench
    assert os.path.dirname(flashattn.bench.__file__) == os.path.dirname(cli.__file__)


def test_cpu_speed_rows_time_ours_beside_sdpa():
    """`flashattn bench --cpu`'s speed table: both timed on the same tensors."""
    import torch

    from flashattn import use_backend

    with use_backend("cpu"):
        rows = bench.cpu_speed_rows([64], dtypes=[torch.float32], heads=2, head_dim=16)
    (row,) = rows
    assert row["dtype"] == "float32" and row["s"] == 64
    assert row["ours_ms"] > 0 and row["sdpa_ms"] > 0
    assert row["speed"] == row["sdpa_ms"] / row["ours_ms"]


def test_fa3_fp8_rows_take_per_head_descales():
    """bench's flashattn-fp8-fa3 rows hand FA3's API what its callers have: e4m3 q, k, v in
    (b, s, h, d) with one descale per (batch, kv head), amax / 448 (q's over its group), and
    the row's callable runs (the CPU path here) to the dequantized inputs' attention."""
    import torch

    from flashattn import bench
    from flashattn.reference import attention_fp8_ref

    torch.manual_seed(0)
    q = torch.randn(2, 64, 4, 32)
    k, v = (torch.randn(2, 64, 2, 32) * 3 for _ in range(2))
    q8, k8, v8, qd, kd, vd = bench.per_head_fp8(q, k, v)
    assert q8.dtype == k8.dtype == v8.dtype == torch.float8_e4m3fn
    assert qd.shape == kd.shape == vd.shape == (2, 2)
    torch.testing.assert_close(kd, k.abs().amax(dim=(1, 3)) / 448.0)
    torch.testing.assert_close(qd, q.abs().amax(dim=(1, 3)).view(2, 2, 2).amax(2) / 448.0)
    for x8, d, x in ((q8, qd, q), (k8, kd, k), (v8, vd, v)):
        back = x8.float() * d.repeat_interleave(x.shape[2] // d.shape[1], 1)[:, None, :, None]
        assert (back - x).abs().max() <= x.abs().max() / 16  # e4m3: 3 mantissa bits
    inputs, fn = bench.build_attention("flashattn-fp8-fa3", q, k, v, causal=True)
    out = fn(*inputs).double()
    tables = (qd.repeat_interleave(2, 1)[..., None], kd[..., None], vd[..., None])
    args = (q8, k8, v8, *tables, 64, 64)
    exact = attention_fp8_ref(*args, causal=True, p_scale=None)
    rmse = lambda a, b: (a - b).pow(2).mean().sqrt().item()  # noqa: E731
    allowed = 2 * rmse(attention_fp8_ref(*args, causal=True), exact) \
        + 2 * rmse(exact.bfloat16().double(), exact)
    assert rmse(out, exact) <= allowed


# ------------------------------------------------------------------------------ bench flags on CPU
# `flashattn bench` without a GPU runs the CPU demo: each flag either acts on it or stops the
# run with a message naming the flag (exit 2). The demo's exactness cases are swapped for one
# tiny case and the shapes are tiny, so each run takes a second or two.
@pytest.fixture
def tiny_demo(monkeypatch):
    from flashattn import check as sc

    monkeypatch.setattr(sc, "demo_cases",
                        lambda: [(sc.Case("tiny", b=1, s_q=16, s_k=16, h=2, h_k=2, d=16), "fp32")])

    def demo(*flags):
        return cli.main(["bench", "--cpu", "--seqlens", "64", "--d", "16", *flags])
    return demo


def test_cli_bench_rejects_unknown_impl(capsys):
    """Checked while parsing, so on a GPU machine too, with the valid names in the message."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--impl", "flashattn,bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--impl" in err and "'bogus'" in err
    for name in ("flashattn-portable", "sdpa-cudnn", "flex", "flashattn-fp8", "fa4"):
        assert name in err


@pytest.mark.parametrize("flags,named", [
    (["--mode", "fwd"], "--mode"), (["--impl", "sdpa-math"], "--impl"),
    (["--dtype", "fp8"], "--dtype fp8"), (["--warmup", "5"], "--warmup"), (["--rep", "5"], "--rep"),
    (["--flex-all-d"], "--flex-all-d")])
def test_cli_bench_gpu_only_flags_stop_the_cpu_demo(flags, named, capsys):
    assert cli.main(["bench", "--cpu", *flags]) == 2
    err = capsys.readouterr().err
    assert named in err and "needs a CUDA GPU" in err


def test_cli_bench_cpu_flags_act(tiny_demo, tmp_path, capsys):
    """--d, --no-causal, --seqlens, --quick (fp32 speed only) and --json shape what runs and
    what is written; the header and sections name the CPU route that ran."""
    path = tmp_path / "cpu.json"
    assert tiny_demo("--quick", "--no-causal", "--json", str(path)) == 0
    out = capsys.readouterr().out
    assert "d=16, non-causal" in out and "route: PyTorch's CPU flash kernel" in out
    assert "(chunked torch)" not in out
    doc = json.loads(path.read_text())
    assert [(r["s"], r["d"], r["causal"]) for r in doc["memory"]] == [(64, 16, False)]
    assert [(r["s"], r["d"], r["causal"], r["dtype"]) for r in doc["speed"]] == \
        [(64, 16, False, "float32")]
    assert [r["status"] for r in doc["exactness"]] == ["PASS"]


def test_cli_bench_cpu_no_save_and_time_budget(tiny_demo, tmp_path, capsys):
    path = tmp_path / "cpu.json"
    assert tiny_demo("--quick", "--causal", "--json", str(path), "--no-save",
                     "--time-budget", "0") == 0
    out = capsys.readouterr().out
    assert not path.exists()
    assert "measurements not run (--time-budget 0 s)" in out and "d=16, causal" in out


def test_cli_bench_cpu_plot(tiny_demo, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "cpu.png"
    assert tiny_demo("--quick", "--plot", str(png)) == 0
    assert png.stat().st_size > 1000


def test_cli_bench_plot_without_matplotlib_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_matplotlib_missing", lambda: True)
    assert cli.main(["bench", "--cpu", "--plot", "x.png"]) == 2
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err and "pip install" in err


def test_cli_bench_cpu_route():
    import torch

    assert cli._cpu_route(64, 16, True, torch.float32) == "PyTorch's CPU flash kernel"
    assert cli._cpu_route(64, 16, False, torch.float64) == "chunked torch"
