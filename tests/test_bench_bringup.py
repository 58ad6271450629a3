"""benchmarks/bench_bringup.py on one tiny model: the row schema the HTML
report reads (not timings)."""
import json
import os
import subprocess
import sys

import torch

from kdebug import bringup_models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = {"model", "backend", "compile_s", "latency_ms_mean", "latency_ms_std", "graphs", "graph_breaks",
          "violations", "accuracy"}


def test_suite_rows_on_the_small_ssm(tmp_path):
    out = tmp_path / "bringup_cpu.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_bringup.py"), "--size", "small",
                        "--device", "cpu", "--models", "ssm", "--runs", "2", "--warmup", "0", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    rows = {r["backend"]: r for r in res["rows"]}
    assert set(rows) == {"eager", "inductor", "constrained"}
    for b, r in rows.items():
        assert FIELDS <= set(r), (b, FIELDS - set(r))
        assert r["model"] == "ssm"
        assert r["latency_ms_mean"] > 0 and r["latency_ms_std"] >= 0
        assert set(r["accuracy"]) >= {"status", "max_abs"}
    assert rows["eager"]["compile_s"] is None and rows["eager"]["violations"] is None
    assert rows["eager"]["accuracy"]["status"] == "reference"
    for b in ("inductor", "constrained"):
        assert rows[b]["compile_s"] > 0
        assert rows[b]["graphs"] == 1 and rows[b]["graph_breaks"] == 0
        assert rows[b]["accuracy"]["status"] == "pass"
    # the sample accelerator wants the last dimension a multiple of 16: the
    # small SSM's depthwise conv weight (kernel 4) and per-head parameters
    # (8 heads) are not
    c = rows["constrained"]
    assert c["violations"] > 0 and c["violations_by_constraint"].get("alignment", 0) > 0
    assert rows["inductor"]["violations"] is None


def test_models_build_at_both_sizes_and_run_small():
    for name in bringup_models.MODELS:
        model, inputs = bringup_models.build(name, "small")
        with torch.no_grad():
            out = model(*inputs)
        leaves = out if isinstance(out, tuple) else (out,)
        assert all(torch.isfinite(t).all() for t in leaves)
    full_bert = bringup_models.BertEncoder(bringup_models.BertConfig(vocab=30522, hidden=768, layers=12, heads=12,
                                                                     intermediate=3072))
    assert 105e6 < bringup_models.parameter_count(full_bert) < 115e6  # BERT-base: ~110M
    assert 11.5e6 < bringup_models.parameter_count(bringup_models.ResNet18()) < 11.8e6  # ResNet-18: 11.69M
