"""benchmarks/host_time.py, the routed call's host path without a GPU: it runs, every case
takes the route it stands in for (the script asserts it), and it writes its rows."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_case_takes_its_route(tmp_path):
    out = tmp_path / "host.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_time.py"),
                           "--calls", "50", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = json.loads(out.read_text())["us_per_call"]
    assert len(rows) == 6 and all(us > 0 for us in rows.values())
