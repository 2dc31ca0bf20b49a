"""examples/precision_assignment.py end to end at a tiny size: files, rows, aggregates."""

import json
import pathlib
import runpy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "precision_assignment.py"


@pytest.mark.slow
def test_example_writes_plot_table_and_json(tmp_path):
    main = runpy.run_path(str(EXAMPLE), run_name="example")["main"]
    main(["--epochs", "1", "--seeds", "1", "--width", "2", "--batch", "512",
          "--out", str(tmp_path), "--name", "pa"])
    assert (tmp_path / "pa.png").stat().st_size > 10_000
    table = (tmp_path / "pa.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| π")]
    assert [r.split("|")[1].strip() for r in rows] == [
        "πfp32", "πunif", "πop", "πours,0.0", "πours,0.25", "πours,0.5", "πours,0.75",
        "πours,1.0"]
    runs = json.loads((tmp_path / "pa.json").read_text())["runs"]
    by = {(r["assignment"], r["r"]): r for r in runs}
    assert by[("fp32", None)]["aggregate"] == 1.0
    assert by[("uniform", None)]["aggregate_start"] == 0.25      # 8 of 32 bits everywhere
    assert by[("ours", 0.0)]["aggregate_start"] == 0.5           # all fp(6,9,0)
    ratios = [by[("ours", r)]["ratio_lo_start"] for r in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert all(a <= b for a, b in zip(ratios, ratios[1:])) and ratios[-1] == 1.0
    assert all(r["ratio_lo_start"] >= r["r"] for r in runs if r["assignment"] == "ours")
