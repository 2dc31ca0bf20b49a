"""Gather one GPU session's stages into a single JSON: device, date, command, tests, tables.

``benchmarks/gpu_session.sh all`` calls this after each stage, so the summary a lent machine
returns holds every stage that finished, even when a later one ran out of time.

    python benchmarks/gpu_summary.py WORK_DIR --out benchmarks/results/gpu-summary.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import xml.etree.ElementTree as ElementTree

TABLES = ("quantize-gpu", "optim-gpu", "optim-gpt2-gpu", "blocks-gpu", "casgd-gpu")


def stages(work: pathlib.Path) -> list[dict]:
    """The stages.tsv lines: name, exit status (124: stopped at its cap) and seconds."""
    path = work / "stages.tsv"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        name, rc, seconds = line.split("\t")
        rows.append({"stage": name, "rc": int(rc), "seconds": int(seconds),
                     "timed_out": int(rc) in (124, 137)})
    return rows


#: a test's outcome line under pytest -v, with xdist ("[gw3] [ 23%] FAILED tests/t.py::x")
#: or without ("tests/t.py::x FAILED [ 23%]")
_OUTCOME = "PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS"
_VERBOSE = re.compile(rf"^(?:\[gw\d+\] \[ *\d+%\] (?P<a>{_OUTCOME}) (?P<ida>\S+::.+?)"
                      rf"|(?P<idb>\S+::.+?) (?P<b>{_OUTCOME})\b.*)$")


def tests_from_log(path: pathlib.Path) -> dict | None:
    """Counts from the -v lines of the test log, for a run stopped before pytest wrote its
    junit report: the tests that finished, and the ids of those that failed (no message)."""
    seen = {}
    for line in path.read_text(errors="replace").splitlines():
        m = _VERBOSE.match(line.strip())
        if m:
            seen[m["ida"] or m["idb"]] = m["a"] or m["b"]
    if not seen:
        return None
    outcomes = list(seen.values())
    failed = [{"test": test, "message": f"{outcome} (from the log; the run was stopped)"}
              for test, outcome in seen.items() if outcome in ("FAILED", "ERROR")]
    skipped = outcomes.count("SKIPPED") + outcomes.count("XFAIL")
    return {"tests": len(outcomes), "failures": outcomes.count("FAILED"),
            "errors": outcomes.count("ERROR"), "skipped": skipped,
            "passed": len(outcomes) - len(failed) - skipped, "failed": failed,
            "complete": False}


def tests(work: pathlib.Path) -> dict | None:
    """Counts of the junit report and, for each failing test, its id and first message line;
    without a report (a run stopped at its cap), what the log's -v lines say."""
    path = work / "tests.xml"
    if not path.exists():
        log = work / "tests.log"
        return tests_from_log(log) if log.exists() else None
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = {key: sum(int(s.get(key, 0)) for s in suites)
              for key in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    failed = []
    for case in root.iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            failed.append({"test": f"{case.get('classname')}::{case.get('name')}",
                           "message": message[0][:300] if message else ""})
    counts["failed"] = failed
    return counts


def _row(rows, **match):
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def _ratio(a, b):
    return None if a is None or b is None or not b else a / b


def headline(tables: dict, tests_counts: dict | None) -> dict:
    """The figures issue 31 tracks, each a ratio against a peer of the same run (None where
    its stage did not finish)."""
    out = {}
    q = tables.get("quantize-gpu")
    if q:
        rows = q["rows"]
        out["copy_GBps"] = q["copy_GBps"]
        for fmt, mode in (("bf16", "nearest"), ("bf16", "stochastic"), ("e4m3fn", "nearest"),
                          ("e4m3fn", "stochastic")):
            row = _row(rows, kernel="lpsim_cuda", format=fmt, mode=mode)
            out[f"quantize_{fmt}_{mode}_vs_copy"] = row and _ratio(row["GBps"], q["copy_GBps"])
        mine = _row(rows, kernel="lpsim_cuda bf16 in, bf16 out", format="e4m3fn")
        peer = _row(rows, kernel="torch .to(float8_e4m3fn).to(bfloat16)", format="e4m3fn")
        out["e4m3fn_of_bf16_vs_torch_cast"] = mine and peer and _ratio(mine["GBps"],
                                                                        peer["GBps"])
        calls = q.get("launch_overhead_us", {})
        out["call_us"] = calls.get("lpsim_cuda nearest, in place")
        out["torch_call_us"] = calls.get("torch t.add_(0)")
        out["front_call_us"] = {k: v for k, v in calls.items() if k.startswith("lpsim.quantize")}
        out["raw_launches"] = q.get("raw_launches")
    o = tables.get("optim-gpu")
    if o:
        sr = o["rows"].get("lpsim bf16 SR (fused)", {})
        out["adamw_bf16_sr_vs_torch_fused"] = sr.get("vs torch fused fp32")
        out["adamw_bf16_sr_of_bound"] = sr.get("of bandwidth bound")
        ao = o["rows"].get("torchao bf16 SR", {})
        out["adamw_bf16_sr_vs_torchao"] = _ratio(ao.get("seconds"), sr.get("seconds"))
        # > 1: the kernel that loads its next quad ahead steps faster (lpsim_cuda.optim)
        ahead = o["rows"].get("lpsim bf16 SR (fused, next quad loaded ahead)", {})
        out["adamw_bf16_sr_ahead_speedup"] = _ratio(sr.get("seconds"), ahead.get("seconds"))
        # > 1: the one-wave grid steps faster than the two-wave grid it replaced
        waves = o["rows"].get("lpsim bf16 SR (fused, two-wave grid)", {})
        out["adamw_bf16_sr_one_wave_speedup"] = _ratio(waves.get("seconds"), sr.get("seconds"))
    o = tables.get("optim-gpt2-gpu")
    if o:       # GPT-2 small's 148 tensors: one launch per set against one per tensor
        sr = o["rows"].get("lpsim bf16 SR (fused)", {})
        out["adamw_gpt2_bf16_sr_vs_torch_fused"] = sr.get("vs torch fused fp32")
        out["adamw_gpt2_bf16_sr_of_bound"] = sr.get("of bandwidth bound")
        alone = o["rows"].get("lpsim bf16 SR (fused, per tensor)", {})
        out["adamw_gpt2_set_vs_per_tensor"] = _ratio(alone.get("seconds"), sr.get("seconds"))
    b = tables.get("blocks-gpu")
    if b:
        rows = b["rows"]
        for fmt in ("mxfp8_e4m3", "nvfp4"):
            mine = _row(rows, case="lpsim.quantize (lpsim_cuda)", format=fmt, mode="nearest")
            peer = _row(rows, case="torchao cast + dequantize", format=fmt, mode="nearest")
            key = fmt.split("_")[0]
            out[f"{key}_nearest_vs_copy"] = mine and mine.get("vs_copy")
            out[f"{key}_vs_torchao"] = mine and peer and _ratio(mine["melems"], peer["melems"])
        given = _row(rows, case="lpsim_cuda.blocks, tensor scale given", format="nvfp4")
        out["nvfp4_given_scale_vs_copy"] = given and given.get("vs_copy")
        mine = _row(rows, case="lpsim.quantize (lpsim_cuda), bfloat16 in")
        peer = _row(rows, case="torchao cast + dequantize, bfloat16 in")
        out["mxfp8_of_bf16_vs_torchao"] = mine and peer and _ratio(mine["melems"],
                                                                    peer["melems"])
        for r in rows:                      # host time of one block call (bench_blocks)
            if "call_us" in r:
                out.setdefault("blocks_call_us", {})[r["case"]] = r["call_us"]
    c = tables.get("casgd-gpu")
    if c:
        for b_, s_ in ((8, 64), (1, 256)):
            row = _row(c["rows"], recipe="C", b=b_, s=s_)
            out[f"casgd_C_speedup_b{b_}_s{s_}"] = row and row["speedup_vs_fp32_sgd"]
        gram = _row(c["gram"], sb=8 * 128)          # the Gram GEMM at b = 8, s = 128
        out["gram_of_peak"] = gram and _ratio(gram["tflops"], c["bf16_peak_tflops"])
        for r in c.get("gram_split", []):           # the same GEMM as slices of features
            if r["sb"] == 8 * 128:
                out[f"gram_split{r['splits']}_of_peak"] = _ratio(r["tflops"],
                                                                 c["bf16_peak_tflops"])
        for key, seconds in c.get("recurrence_alone_s", {}).items():
            b_, s_ = key.split(",")
            out[f"casgd_recurrence_us_b{b_}_s{s_}"] = seconds * 1e6
    if tests_counts:
        out["real_gpu_tests"] = {"passed": tests_counts["passed"],
                                 "failed": len(tests_counts["failed"]),
                                 "skipped": tests_counts["skipped"]}
    return out


def summary(work: pathlib.Path, command: str) -> dict:
    device = (work / "device.txt").read_text() if (work / "device.txt").exists() else ""
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": command, "device": device.strip().splitlines(),
           "stages": stages(work), "tests": tests(work), "tables": {}}
    for name in TABLES:
        path = work / f"{name}.json"
        if path.exists():
            out["tables"][name] = json.loads(path.read_text())
    out["tensor_cores_recorded"] = (work / "tensor-cores.npz").exists()
    commit = work / "commit.txt"
    out["commit"] = commit.read_text().strip() if commit.exists() else None
    return {**{k: out[k] for k in ("device", "date", "commit", "command")},
            **headline(out["tables"], out["tests"]), **out}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=pathlib.Path, help="the folder the stages wrote into")
    parser.add_argument("--out", required=True, type=pathlib.Path,
                        help="the summary JSON to write (gpu-summary.json)")
    parser.add_argument("--command", default="bash benchmarks/gpu_session.sh all",
                        help="the command the summary says was run")
    args = parser.parse_args()
    if not args.work.is_dir():
        parser.error(f"work folder {str(args.work)!r} does not exist")
    if not args.out.parent.is_dir():
        parser.error(f"--out {str(args.out)!r}: the folder {str(args.out.parent)!r} does not "
                     "exist")
    result = summary(args.work, args.command)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    t = result["tests"]
    if t:
        print(f"tests: {t['passed']} passed, {len(t['failed'])} failed, {t['skipped']} skipped")
    for s in result["stages"]:
        print(f"{s['stage']:8s} rc {s['rc']:3d}  {s['seconds']:4d} s")


if __name__ == "__main__":
    main()
