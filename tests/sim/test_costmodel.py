"""The simulator reproduces the measured H200 points; shape/TP scaling; PD vs aggregated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pd_operator_tools.enginesim.clock import VirtualClock
from pd_operator.perfmodel import calibration
from pd_operator.perfmodel.costmodel import CALIBRATED, LINKS, CostModel, Efficiency, Link, shape_for
from pd_operator_tools.enginesim.engine import Engine, SimRequest
from pd_operator_tools.enginesim.fleet import Fleet
from pd_operator_tools.workload import LengthDist, Workload, summarize


# the least-squares fits' own worst residuals are 14.6% (prefill) and 8.1% (decode)
PREFILL_TOL = 0.15
DECODE_TOL = 0.085


@pytest.fixture(scope="module")
def calib() -> dict:
    return calibration()


def test_shape_matches_measurement(calib):
    assert CALIBRATED.kv_bytes_per_token == calib["model"]["kv_bytes_per_token"]
    assert CALIBRATED.weight_bytes == pytest.approx(calib["model"]["weight_bytes"])
    cap = CostModel().kv_capacity_tokens()
    assert cap == pytest.approx(calib["model"]["kv_tokens_fit_in_free_after_weights"], rel=1e-3)


def test_prefill_points_through_the_engine(calib):
    """Batch-1 prefill of T tokens, timed by the scheduler in virtual time."""
    cm = CostModel(eff=Efficiency.pytorch())
    worst = 0.0
    for p in calib["prefill"]:
        clock = VirtualClock()
        eng = Engine(clock, cm, "prefill", max_batched_tokens=16384)
        req = eng.add(SimRequest(p["T"], 1, prefill_only=True))
        clock.run()
        err = req.ttft * 1e3 / p["graph_ms"]["median"] - 1
        worst = max(worst, abs(err))
        assert abs(err) <= PREFILL_TOL, (p["T"], req.ttft * 1e3, p["graph_ms"]["median"])
    print(f"prefill: worst relative error {worst:.3f}")


def test_decode_points_through_the_engine(calib):
    """B sequences with ctx cached tokens: the first decode step after the KV arrived."""
    cm = CostModel(eff=Efficiency.pytorch())
    instant = Link("instant", 1e9, 0.0)
    worst = 0.0
    for p in calib["decode"]:
        clock = VirtualClock()
        eng = Engine(clock, cm, "decode", link=instant, max_num_seqs=1024, kv_capacity_tokens=10**8)
        reqs = [eng.add(SimRequest(p["ctx"], 2, kv_transfer=True)) for _ in range(p["batch"])]
        clock.run()
        step_ms = (reqs[0].first_token - reqs[0].kv_ready) * 1e3
        assert all(r.first_token == reqs[0].first_token for r in reqs)  # one batch
        err = step_ms / p["graph_ms"]["median"] - 1
        worst = max(worst, abs(err))
        assert abs(err) <= DECODE_TOL, (p["batch"], p["ctx"], step_ms, p["graph_ms"]["median"])
    print(f"decode: worst relative error {worst:.3f}")


def test_fused_efficiency_matches_the_measured_fused_attention(calib):
    """The fused engine's per-token KV cost is what the fused (cuDNN) attention
    kernel measured at the largest batch; its fixed step streams the weights no
    faster than the measured HBM copy ceiling allows, and beats plain PyTorch."""
    fused, torch = CostModel(), CostModel(eff=Efficiency.pytorch())
    big = max(calib["attn_backends"], key=lambda p: p["batch"] * p["ctx"])
    per_token_ms = big["cudnn_ms"]["median"] / (big["batch"] * (big["ctx"] + 1))
    assert fused.eff.decode_kv_ms_per_token == pytest.approx(per_token_ms, rel=0.05)
    hbm_floor_ms = calib["model"]["weight_bytes"] / (calib["ceilings"]["cuda:0"]["d2d_copy_TBps"] * 1e12) * 1e3
    assert hbm_floor_ms < fused.decode_fixed_ms() < torch.decode_fixed_ms()
    assert fused.decode_uniform_ms(64, 2000) < torch.decode_uniform_ms(64, 2000)


def test_shape_and_tp_scaling():
    fused = CostModel()
    # TP halves the weight and KV terms (first order, no communication cost)
    tp2 = CostModel(tp=2)
    assert tp2.decode_fixed_ms() == pytest.approx(fused.decode_fixed_ms() / 2)
    assert tp2.kv_capacity_tokens() > 2 * fused.kv_capacity_tokens()
    big = CostModel(shape_for("Qwen/Qwen3-32B"))
    assert big.prefill_ms(2000) > 3 * fused.prefill_ms(2000)
    assert big.decode_uniform_ms(32, 2000) > fused.decode_uniform_ms(32, 2000)
    with pytest.raises(KeyError, match="unknown model"):
        shape_for("acme/unknown-7b")
    assert shape_for("Llama-3.1-70B-Instruct").layers == 80


def test_kv_transfer_time_matches_the_measured_copies(calib):
    """NVLink (per-layer peer copies) and PCIe (pinned host, pipelined) links
    reproduce the measured transfers of the same KV; RDMA was not measured."""
    kv = calib["kv_transfer"]
    cm = CostModel()
    for link, method in (("nvlink", "p2p_copy_perlayer36"), ("pcie", "host_pinned_perlayer36_pipelined_2streams")):
        m = kv["methods"][method]
        gbps = m.get("GBps_event") or m["GBps_host"]
        measured_ms = m["bytes"] / (gbps * 1e9) * 1e3
        assert cm.transfer_ms(kv["tokens"], LINKS[link]) == pytest.approx(measured_ms, rel=0.15), link


def test_kv_capacity_makes_requests_wait():
    clock = VirtualClock()
    eng = Engine(clock, CostModel(), "unified", kv_capacity_tokens=3000)
    a = eng.add(SimRequest(2000, 10))
    b = eng.add(SimRequest(2000, 10))
    clock.run(max_events=1)  # the first scheduling pass
    assert eng.num_running == 1 and eng.num_waiting == 1
    clock.run()
    assert b.admitted >= a.finished


def test_token_budget_chunks_prefill():
    clock = VirtualClock()
    eng = Engine(clock, CostModel(), "unified", max_batched_tokens=512)
    r = eng.add(SimRequest(2000, 1))
    clock.run()
    assert eng.steps == 4  # 512 + 512 + 512 + 464
    assert r.ttft * 1e3 == pytest.approx(4 * CostModel().prefill_fixed_ms() + CostModel().prefill_chunk_ms(0, 2000))


def test_pd_itl_p99_clearly_lower_than_aggregated():
    """Same 2 GPUs, same seeded mixed load: aggregated (2 unified engines) vs 1 prefill + 1 decode."""
    wl = dict(rate=6.0, isl=LengthDist("uniform", 3000, 0.5), osl=LengthDist("uniform", 300, 0.5),
              num_requests=600, seed=1)
    agg = summarize(Fleet("aggregated", unified=2).run_workload(Workload(**wl)))
    pd_ = summarize(Fleet("pd", prefill=1, decode=1).run_workload(Workload(**wl)))
    print(f"aggregated: {agg}\npd: {pd_}")
    assert agg["completed"] == pd_["completed"] == 600
    assert pd_["itl_s"]["p99"] < 0.2 * agg["itl_s"]["p99"]
    assert pd_["itl_s"]["p99"] < 0.010 < 0.050 < agg["itl_s"]["p99"]


def test_virtual_fleet_is_deterministic():
    wl = Workload(rate=4.0, isl=LengthDist("lognormal", 1500, 0.6), osl=LengthDist("fixed", 100), num_requests=100, seed=7)
    a = summarize(Fleet("pd").run_workload(wl))
    b = summarize(Fleet("pd").run_workload(wl))
    assert a == b


def test_fleet_resize_drains():
    """Pools can be resized between run() calls (the autoscaling benchmark drives this)."""
    f = Fleet("pd", prefill=1, decode=2)
    wl = Workload(rate=8.0, isl=LengthDist("fixed", 1000), osl=LengthDist("fixed", 50), num_requests=80, seed=2)
    for t, isl, osl in wl.arrivals():
        f.clock.call_at(t, f.submit, isl, osl)
    f.clock.run(until=5.0)
    gone = f.remove_engine("decode")
    f.add_engine("prefill")
    f.clock.run()
    assert all(r.done is not None for r in f.records)
    assert gone.num_running == gone.num_waiting == 0
