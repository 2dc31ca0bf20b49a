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
import xml.etree.ElementTree as ElementTree

TABLES = ("quantize-gpu", "optim-gpu", "blocks-gpu", "casgd-gpu")


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


def tests(work: pathlib.Path) -> dict | None:
    """Counts of the junit report and, for each failing test, its id and first message line."""
    path = work / "tests.xml"
    if not path.exists():
        return None
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
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=pathlib.Path, help="the folder the stages wrote into")
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--command", default="bash benchmarks/gpu_session.sh all")
    args = parser.parse_args()
    result = summary(args.work, args.command)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    t = result["tests"]
    if t:
        print(f"tests: {t['passed']} passed, {len(t['failed'])} failed, {t['skipped']} skipped")
    for s in result["stages"]:
        print(f"{s['stage']:8s} rc {s['rc']:3d}  {s['seconds']:4d} s")


if __name__ == "__main__":
    main()
