"""``pdctl simulate``: a policy edit tried on a trace before it is applied.

Short synthetic windows (30 simulated minutes of the evening surge at 0.2x the
reference rates: ~15 k requests, about a second per spec; 15 minutes for the
determinism checks)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import yaml

from pd_operator.cli import main
from pd_operator_tools.autoscalesim import whatif as sim
from pd_operator_tools.autoscalesim.trace import REFERENCE, TraceError, load_trace

WINDOW = ["--hours", "0.5", "--start-hour", "19.9", "--rate-scale", "0.2", "--jobs", "1"]
SHORT = ["--hours", "0.25", "--start-hour", "20", "--rate-scale", "0.2", "--jobs", "1"]
SHORT_TRACE = replace(REFERENCE, start_h=20.0, hours=0.25, rate_scale=0.2)

CURRENT = {
    "apiVersion": "pdserving.io/v1alpha1",
    "kind": "PDInferenceService",
    "metadata": {"name": "qwen3-8b-auto", "namespace": "default"},
    "spec": {
        "model": {"name": "Qwen/Qwen3-8B"},
        "engine": {"kind": "vllm"},
        "router": {"image": "registry.example.com/pd/router:test"},
        "prefill": {"replicas": 1, "tensorParallelSize": 1,
                    "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 8,
                                    "target": {"metric": "ttft", "quantile": 0.99, "value": "1s"}}},
        "decode": {"replicas": 2, "tensorParallelSize": 1,
                   "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 16,
                                   "target": {"metric": "itl", "quantile": 0.99, "value": "50ms"}}},
        "autoscaling": {"interval": "30s", "maxTotalGPUs": 24},
    },
}


def _spec(tmp_path, name: str, edit=None) -> str:
    doc = copy.deepcopy(CURRENT)
    if edit:
        edit(doc["spec"])
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _run(capsys, *argv) -> tuple[int, dict | None, str]:
    code = main(["simulate", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 and "--json" in argv else None), err


def _figures(row: dict) -> tuple:
    return tuple(row[k] for k in ("goodput", "ttft_p99", "itl_p99", "gpu_hours", "actions", "requests"))


def test_decode_capped_far_too_low_loses_goodput(tmp_path, capsys):
    def cap(spec):
        spec["decode"]["replicas"] = 1
        spec["decode"]["autoscaling"]["maxReplicas"] = 1

    code, rep, err = _run(capsys, "-f", _spec(tmp_path, "current", None), "--candidate", _spec(tmp_path, "capped", cap),
                          *WINDOW, "--json")
    assert code == 0, err
    current, candidate = rep["results"]
    assert current["goodput"] > 0.9
    assert candidate["goodput"] < current["goodput"] - 0.3  # one decode replica cannot carry the surge
    assert rep["delta"]["goodput"] == pytest.approx(candidate["goodput"] - current["goodput"])
    assert candidate["requests"] == current["requests"] > 5_000  # the same trace


def test_tighter_targets_cost_at_least_as_many_gpu_hours(tmp_path, capsys):
    def tighten(spec):
        spec["prefill"]["autoscaling"]["target"]["value"] = "300ms"
        spec["decode"]["autoscaling"]["target"]["value"] = "25ms"

    code, rep, err = _run(capsys, "-f", _spec(tmp_path, "current"), "--candidate", _spec(tmp_path, "tight", tighten),
                          *WINDOW, "--json")
    assert code == 0, err
    current, candidate = rep["results"]
    assert candidate["gpu_hours"] >= current["gpu_hours"]
    # both judged by the current spec's targets (1 s, 50 ms), not the candidate's own
    assert rep["slo"]["ttft_s"] == 1.0 and rep["slo"]["mean_itl_s"] == 0.05
    assert candidate["goodput"] >= current["goodput"]


def test_identical_specs_give_identical_figures(tmp_path, capsys):
    path = _spec(tmp_path, "current")
    code, rep, err = _run(capsys, "-f", path, "--candidate", path, *SHORT, "--json")
    assert code == 0, err
    a, b = rep["results"]
    assert _figures(a) == _figures(b)
    assert all(v == 0 for k, v in rep["delta"].items())


def test_text_report_names_the_yardstick_and_the_delta(tmp_path, capsys):
    code = main(["simulate", "-f", _spec(tmp_path, "current"), "--candidate", _spec(tmp_path, "cand"),
                 "--hours", "0.1", "--start-hour", "12", "--rate-scale", "0.1", "--jobs", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "the current spec's targets, for both runs" in out and "TTFT < 1s and mean ITL < 50ms" in out
    for word in ("goodput", "TTFT p99", "ITL p99", "GPU-hours", "good req/GPU-h", "scaling actions",
                 "delta (candidate - current)"):
        assert word in out


def test_recorded_trace_gives_the_synthetic_figures(tmp_path, capsys):
    """A trace written to a file and read back is the same trace: same figures."""
    csv_path, jsonl_path = tmp_path / "trace.csv", tmp_path / "trace.jsonl"
    arrivals = list(SHORT_TRACE.arrivals())
    csv_path.write_text("# exported\nt,isl,osl,user\n" + "".join(f"{t!r},{i},{o},x\n" for t, i, o in arrivals))
    jsonl_path.write_text("".join(json.dumps({"t": t, "isl": i, "osl": o}) + "\n" for t, i, o in reversed(arrivals)))
    path = _spec(tmp_path, "current")
    code, synthetic, err = _run(capsys, "-f", path, *SHORT, "--json")
    assert code == 0, err
    for trace in (csv_path, jsonl_path):
        code, recorded, err = _run(capsys, "-f", path, "--trace-file", str(trace), "--jobs", "1", "--json")
        assert code == 0, err
        assert _figures(recorded["results"][0]) == _figures(synthetic["results"][0])


@pytest.mark.parametrize("text, where, what", [
    ("t,isl,osl\n0.5,100,10\n1.0,abc,10\n", ":3:", "isl must be a number"),
    ("t,isl,osl\n0.5,100,10\n\n# comment\n1.0,100\n", ":5:", "2 fields"),
    ("t,isl,osl\n-1,100,10\n", ":2:", "t must be >= 0"),
    ("t,isl,osl\n1,100,2.5\n", ":2:", "osl must be a whole number"),
    ("time,prompt\n1,2\n", ":1:", "header must name the columns t, isl, osl"),
    ('{"t": 0, "isl": 10, "osl": 5}\n{"t": 1, "isl": 10}\n', ":2:", "missing osl"),
    ('{"t": 0, "isl": 10, "osl": 5}\n{"t": 1, "isl": 10, "osl": 5\n', ":2:", "not valid JSON"),
])
def test_malformed_trace_names_the_line(tmp_path, capsys, text, where, what):
    trace = tmp_path / "bad.csv"
    trace.write_text(text)
    with pytest.raises(TraceError) as err:
        load_trace(str(trace))
    assert f"{trace}{where}" in str(err.value) and what in str(err.value)
    code, _, msg = _run(capsys, "-f", _spec(tmp_path, "current"), "--trace-file", str(trace))
    assert code == 1 and f"{trace}{where}" in msg and what in msg


def test_request_larger_than_the_engine_is_refused_with_its_line(tmp_path, capsys):
    trace = tmp_path / "big.csv"
    trace.write_text("t,isl,osl\n0,1000,100\n1,40000,2000\n")
    code, _, err = _run(capsys, "-f", _spec(tmp_path, "current"), "--trace-file", str(trace))
    assert code == 1 and f"{trace}:3: isl + osl = 42000 tokens exceed" in err


def test_invalid_spec_names_the_field(tmp_path, capsys):
    def bad(spec):
        spec["decode"]["autoscaling"]["minReplicas"] = 20  # > maxReplicas 16

    code, _, err = _run(capsys, "-f", _spec(tmp_path, "current"), "--candidate", _spec(tmp_path, "bad", bad), *WINDOW)
    assert code == 1
    assert "bad.yaml" in err and "spec.decode.autoscaling.minReplicas" in err and "minReplicas must be <= maxReplicas" in err


def test_unknown_model_lists_the_known_ones(tmp_path, capsys):
    def other(spec):
        spec["model"]["name"] = "acme/giant-1T"

    code, _, err = _run(capsys, "-f", _spec(tmp_path, "current", other), *WINDOW)
    assert code == 1
    assert "spec.model.name" in err and "acme/giant-1T" in err and "Qwen/Qwen3-8B" in err and "Llama-3.1-70B" in err


def test_what_the_cost_model_cannot_run_is_refused(tmp_path, capsys):
    def pp(spec):
        spec["prefill"]["pipelineParallelSize"] = 2  # NIXL takes PP on prefill only
        spec["decode"]["gpuProduct"] = "NVIDIA-A100-SXM4-80GB"

    code, _, err = _run(capsys, "-f", _spec(tmp_path, "current", pp), *WINDOW)
    assert code == 1 and "spec.prefill.pipelineParallelSize" in err and "spec.decode.gpuProduct" in err

    def nvfp4(spec):
        spec["decode"].setdefault("extraArgs", []).extend(["--kv-cache-dtype", "nvfp4"])

    code, _, err = _run(capsys, "-f", _spec(tmp_path, "current", nvfp4), *WINDOW)
    assert code == 1 and "spec.decode.extraArgs" in err and "nvfp4" in err and "spec.prefill" not in err

    def kv_memory(spec):
        spec["decode"].setdefault("extraArgs", []).extend(["--kv-cache-memory-bytes", "20G"])

    # the simulated fleet sizes the KV cache from gpuMemoryUtilization only: refused, not run as the default
    code, _, err = _run(capsys, "-f", _spec(tmp_path, "current", kv_memory), *WINDOW)
    assert code == 1 and "spec.decode.extraArgs" in err and "--kv-cache-memory-bytes" in err and "spec.prefill" not in err

    def blocks(spec):
        spec["prefill"].setdefault("extraArgs", []).extend(["--num-gpu-blocks-override", "4096"])

    code, _, err = _run(capsys, "-f", _spec(tmp_path, "current", blocks), *WINDOW)
    assert code == 1 and "spec.prefill.extraArgs" in err and "--num-gpu-blocks-override" in err

    def speculative(spec):
        spec["decode"].setdefault("extraArgs", []).extend(["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}'])

    code, _, err = _run(capsys, "-f", _spec(tmp_path, "current", speculative), *WINDOW)
    assert code == 1 and "spec.decode.extraArgs" in err and "speculative decoding" in err

    def sglang_cap(spec):
        spec["engine"] = {**spec["engine"], "kind": "sglang", "extraArgs": ["--max-total-tokens", "100k"]}

    code, _, err = _run(capsys, "-f", _spec(tmp_path, "current", sglang_cap), *WINDOW)
    assert code == 1 and "spec.engine.extraArgs" in err and "--max-total-tokens" in err


def test_unreadable_inputs_exit_2(tmp_path, capsys):
    path = _spec(tmp_path, "current")
    assert _run(capsys, "-f", str(tmp_path / "missing.yaml"))[0] == 2
    (tmp_path / "notyaml.yaml").write_text("spec: [unclosed\n")
    assert _run(capsys, "-f", str(tmp_path / "notyaml.yaml"))[0] == 2
    code, _, err = _run(capsys, "-f", path, "--trace-file", str(tmp_path / "missing.csv"))
    assert code == 2 and "missing.csv" in err
    code, _, err = _run(capsys, "-f", path, "--trace-file", str(tmp_path / "missing.csv"), "--hours", "1")
    assert code == 2 and "--hours" in err and "synthetic" in err
    code, _, err = _run(capsys, "-f", path, "--initial", "2,x")
    assert code == 2 and "--initial" in err


def test_initial_sizes_follow_the_spec_or_the_option(tmp_path):
    svc = sim.load_spec(_spec(tmp_path, "current"))
    assert sim.initial_sizes(svc) == {"prefill": 1, "decode": 2}               # spec replicas
    assert sim.initial_sizes(svc, {"prefill": 3, "decode": 40}) == {"prefill": 3, "decode": 16}  # within min..max


def test_static_pool_keeps_its_size_and_gpus_count_tp(tmp_path):
    """A pool without autoscaling stays at its replicas; GPU-hours count tensorParallelSize GPUs per replica."""
    def static_tp2(spec):
        spec["prefill"] = {"replicas": 2, "tensorParallelSize": 2}
        spec["decode"]["tensorParallelSize"] = 2

    svc = sim.load_spec(_spec(tmp_path, "static", static_tp2))
    short = replace(SHORT_TRACE, hours=0.1, start_h=12.0, rate_scale=0.1)
    (run,) = sim.simulate([sim.Run("current", "static.yaml", svc)], short, jobs=1)
    res = run.result
    assert set(res.timeline["prefill"]) == {2}
    # at least the static prefill pool's 2 x 2 GPUs for the whole window, plus decode
    assert res.gpu_hours >= 2 * 2 * short.duration / 3600 + 2 * short.duration / 3600 - 1e-9
