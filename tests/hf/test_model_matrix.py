"""The support matrix's CI sample (benchmarks/model_matrix.py; the full matrix is a benchmark).

One model per family (decoder LM, encoder LM, ViT, CNN with batch norm), built from a tiny config
as transformers makes it, planned at 1 and 2 devices; its model-parallel 2-process plan runs and
matches 1 process (fp32, rtol 1e-5); the row carries predicted and measured step time and peak.
The reproducers of the crash classes the matrix found run in tests/hf/test_matrix_reproducers.py
(one launch) and tests/capture/test_cpu_kernels.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the HuggingFace tests need the dev extra (transformers 5.x)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import model_matrix  # noqa: E402

from tensoropt.models.hf_auto import build  # noqa: E402

SAMPLE = {arch: (model_type, family) for model_type, arch, family in model_matrix.selected(
    list(model_matrix.SAMPLE), False)}


def test_the_sample_has_one_model_per_family():
    assert list(SAMPLE) == list(model_matrix.SAMPLE)
    assert sorted({family for _, family in SAMPLE.values()}) == sorted(model_matrix.FAMILIES)
    assert {"ViTForImageClassification", "ResNetForImageClassification"} <= set(SAMPLE)


def test_an_unknown_architecture_is_one_line_naming_the_key():
    with pytest.raises(ValueError, match=r"model.kwargs.architecture: .* no model class 'GPT3LMHeadModel'"):
        build("GPT3LMHeadModel")


def test_tiny_configs_are_tiny_and_free_of_randomness():
    for arch, (model_type, family) in SAMPLE.items():
        config = model_matrix.tiny_config(model_type, family)
        model = build(arch, **config)
        assert sum(p.numel() for p in model.parameters()) < 200_000, arch
        assert all(v == 0.0 for k, v in config.items() if "drop" in k), arch  # dropout, drop path


def test_a_worker_failure_in_the_log_becomes_the_rows_reason():
    log = "noise\n[tensoropt] rank 1 failed: ValueError: model 'x': no value\nTraceback ...\n"
    assert model_matrix._worker_error(log) == "ValueError: model 'x': no value"
    assert model_matrix._worker_error("all fine") is None


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("arch", list(model_matrix.SAMPLE))
def test_sample_model_runs_model_parallel_and_matches_one_process(arch, tmp_path):
    model_type, family = SAMPLE[arch]
    row = model_matrix.measure(model_type, arch, family, tmp_path)
    assert row["outcome"] == "runs, matches", f"{arch}: {row['stage']}: {row['reason']}"
    assert row["plans"][0] >= 1 and row["plans"][1] >= 1
    assert set(row["plan_labels"]) - {"batch=2"}, row["plan_labels"]  # splits more than the batch
    assert row["max_loss_error"] <= 1e-5
    assert row["predicted_time_s"] > 0 and row["measured_time_s"] > 0
    assert row["predicted_peak_bytes"] > 0 and row["measured_peak_bytes"] > 0
