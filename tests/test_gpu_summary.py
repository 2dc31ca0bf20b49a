"""benchmarks/gpu_summary.py: a lent GPU run stopped at its cap still names its failures."""

import importlib.util
import pathlib

import pytest

_spec = importlib.util.spec_from_file_location(
    "gpu_summary", pathlib.Path(__file__).parent.parent / "benchmarks" / "gpu_summary.py")
gpu_summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_summary)

# pytest -v output, with xdist and without (pytest 9), each cut off before its summary
XDIST = """\
bringing up nodes...
[gw1] [ 16%] SKIPPED tests/test_a.py::test_s 
[gw0] [ 33%] PASSED tests/test_a.py::test_p 
[gw1] [ 50%] PASSED tests/test_a.py::test_q[a b] 
[gw1] [ 66%] ERROR tests/test_a.py::test_e 
[gw0] [ 83%] FAILED tests/test_a.py::test_f 
[gw0] [100%] PASSED tests/test_a.py::test_q[2] 
"""
PLAIN = """\
tests/test_a.py::test_p PASSED                                                 [ 16%]
tests/test_a.py::test_f FAILED                                                 [ 33%]
tests/test_a.py::test_s SKIPPED (unconditional skip)                           [ 50%]
tests/test_a.py::test_q[a b] PASSED                                            [ 66%]
tests/test_a.py::test_q[2] PASSED                                              [ 83%]
tests/test_a.py::test_e ERROR                                                  [100%]
FAILED tests/test_a.py::test_f - assert 0
"""


def test_a_stopped_run_is_counted_from_its_verbose_log(tmp_path):
    for text in (XDIST, PLAIN):
        (tmp_path / "tests.log").write_text(text)
        got = gpu_summary.tests(tmp_path)
        assert {k: got[k] for k in ("tests", "passed", "failures", "errors", "skipped")} == \
            {"tests": 6, "passed": 3, "failures": 1, "errors": 1, "skipped": 1}
        assert sorted(f["test"] for f in got["failed"]) == \
            ["tests/test_a.py::test_e", "tests/test_a.py::test_f"]
        assert got["complete"] is False


def test_a_log_without_outcomes_gives_no_counts(tmp_path):
    (tmp_path / "tests.log").write_text("bringing up nodes...\n......F.. [100%]\n")
    assert gpu_summary.tests(tmp_path) is None
    assert gpu_summary.tests(tmp_path / "absent") is None


def test_the_optimizer_figures_come_from_both_tables():
    """One tensor of 10**8 and GPT-2 small's 148 tensors: each figure from its own table
    (one launch per set against one per tensor: the per-tensor time over the set's)."""
    one = {"rows": {"lpsim bf16 SR (fused)": {"vs torch fused fp32": 0.5, "seconds": 2.0,
                                              "of bandwidth bound": 0.25},
                    "torchao bf16 SR": {"seconds": 1.0}}}
    gpt2 = {"rows": {"lpsim bf16 SR (fused)": {"vs torch fused fp32": 1.2, "seconds": 3.0,
                                               "of bandwidth bound": 0.6},
                     "lpsim bf16 SR (fused, per tensor)": {"seconds": 12.0}}}
    got = gpu_summary.headline({"optim-gpu": one, "optim-gpt2-gpu": gpt2}, None)
    assert (got["adamw_bf16_sr_vs_torch_fused"], got["adamw_bf16_sr_vs_torchao"]) == (0.5, 0.5)
    assert (got["adamw_gpt2_bf16_sr_vs_torch_fused"], got["adamw_gpt2_bf16_sr_of_bound"],
            got["adamw_gpt2_set_vs_per_tensor"]) == (1.2, 0.6, 4.0)
    assert "adamw_gpt2_set_vs_per_tensor" not in gpu_summary.headline({"optim-gpu": one}, None)


def test_the_casgd_figures_come_from_its_table():
    """bench_casgd's table: recipe C's speedups, the Gram GEMM at s*b = 1024 (one GEMM and
    its split forms) of the measured peak, the recurrence alone in microseconds; a table
    from before the split forms and the recurrence rows gives the first figures alone."""
    rows = [{"recipe": "C", "b": 8, "s": 64, "speedup_vs_fp32_sgd": 9.0},
            {"recipe": "C", "b": 1, "s": 256, "speedup_vs_fp32_sgd": 21.0}]
    old = {"rows": rows, "bf16_peak_tflops": 800.0,
           "gram": [{"sb": 1024, "n": 9984, "tflops": 560.0}]}
    new = dict(old, gram_split=[{"sb": 512, "splits": 2, "tflops": 100.0},
                                {"sb": 1024, "splits": 2, "tflops": 720.0},
                                {"sb": 1024, "splits": 4, "tflops": 680.0}],
               recurrence_alone_s={"8,64": 5e-5, "1,256": 1.5e-4})
    got = gpu_summary.headline({"casgd-gpu": new}, None)
    assert (got["casgd_C_speedup_b8_s64"], got["casgd_C_speedup_b1_s256"]) == (9.0, 21.0)
    assert (got["gram_of_peak"], got["gram_split2_of_peak"], got["gram_split4_of_peak"]) \
        == (0.7, 0.9, 0.85)
    assert (got["casgd_recurrence_us_b8_s64"], got["casgd_recurrence_us_b1_s256"]) \
        == pytest.approx((50.0, 150.0))
    got = gpu_summary.headline({"casgd-gpu": old}, None)
    assert got["gram_of_peak"] == 0.7 and not any(k.startswith(("gram_split", "casgd_rec"))
                                                   for k in got)
