"""The examples run from any directory, write only where told, and document every option."""

import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import child_pythonpath

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCRIPT = EXAMPLES / "rounding_error_vs_precision.py"
RESULTS = EXAMPLES / "results"
ENV = {**os.environ, "PYTHONPATH": child_pythonpath()}


def run_example(cwd, *args):
    return subprocess.run([sys.executable, str(SCRIPT), "--values", "10", "--steps", "600",
                           "--runs", "4", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=300)


def test_example_writes_to_a_temporary_directory_by_default(tmp_path):
    done = run_example(tmp_path)
    assert done.returncode == 0, done.stderr
    png = pathlib.Path(re.search(r"wrote (\S+)", done.stdout).group(1))
    assert png.is_file() and png.parent != ROOT / "examples" / "results"
    assert list(tmp_path.iterdir()) == []                     # nothing in the working directory
    # bf16 at sums >= 0.5: half a gap (2**-8) exceeds 1e-3, so nearest stops at 0.5 exactly;
    # SR's mean of 4 runs ends at 0.6 +- 0.009 (sd): below 0.55 is a 5-sd event (fixed seed)
    final = dict(re.findall(r"^(\S+(?:, 4 bits)?)\s+final sum (\S+)", done.stdout, re.M))
    assert float(final["nearest"]) == 0.5 and float(final["stochastic"]) > 0.55


def test_example_out_directory_and_help(tmp_path):
    done = run_example(ROOT / "tests", "--out", str(tmp_path / "figures"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "figures" / "rounding_error.png").is_file()
    helptext = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                              text=True, env=ENV).stdout
    options = re.findall(r"^  (--\w+) \w+\s*\n?\s+(\S.*)$", helptext, re.M)
    assert {o for o, _ in options} == {"--out", "--values", "--format", "--increment", "--steps",
                                       "--runs"}                  # each with its description


# Runs each example's main() with parse_args replaced, all in one interpreter (one import of
# torch): prints {script: {option: help}} of their parsers.
DUMP_OPTIONS = """
import argparse, json, runpy, sys
found = {}
def dump(self, args=None, namespace=None):
    found[sys.argv[0]] = {a.option_strings[-1]: a.help for a in self._actions
                          if a.option_strings}
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = dump
for script in sys.argv[1:]:
    sys.argv = [script]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        pass
print(json.dumps(found))
"""
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


@pytest.fixture(scope="module")
def example_options():
    done = subprocess.run([sys.executable, "-c", DUMP_OPTIONS,
                           *(str(EXAMPLES / script) for script in SCRIPTS)],
                          capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr
    return {pathlib.Path(k).name: v for k, v in
            json.loads(done.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize("script", SCRIPTS)              # scripts, not helpers
def test_every_option_of_every_example_has_help(script, example_options):
    assert script in example_options, f"{script} never parsed its arguments"
    options = example_options[script]
    assert "--help" in options and len(options) > 1
    undocumented = [opt for opt, text in options.items() if len((text or "").split()) < 2]
    assert not undocumented, f"{script}: options without a description: {undocumented}"


def digests(folder: pathlib.Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


@pytest.mark.slow
def test_casgd_recipes_leaves_committed_results_alone(tmp_path):
    """A tiny run without --out, from another directory: a temporary output directory, every
    bar at its total, and examples/results/ byte for byte as before."""
    before = digests(RESULTS)
    tiny = ["--m", "256", "--n", "16", "--H", "2", "--P", "2", "--s", "2", "--seeds", "1", "2",
            "--losses", "logistic", "linear", "--eta", "sweep", "--sweep-steps", "10",
            "--fig-m", "256", "--fig-n", "16", "--fig-H", "3", "--fig-P", "2",
            "--fig-recipes", "C", "D", "I"]
    done = subprocess.run([sys.executable, str(EXAMPLES / "casgd_recipes.py"), *tiny],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert digests(RESULTS) == before
    assert list(tmp_path.iterdir()) == []                     # nothing in the working directory
    out = pathlib.Path(re.search(r"^wrote .* in (\S+)$", done.stdout, re.M).group(1))
    assert out.is_dir() and not out.is_relative_to(ROOT)
    assert sorted(p.name for p in out.iterdir()) == [
        "casgd_figure3.md", "casgd_figure3.png", "casgd_table5.md"]
    figure = (out / "casgd_figure3.md").read_text()
    assert re.search(r"^\| C \| b \| b \| b \| f \| f \| b \| b \| f \| f \|", figure, re.M)
    assert "| eta | mean final F(x) |" in (out / "casgd_table5.md").read_text()
    # the main bar: 2 losses x 1 s x 2 seeds x 2 recipes x H=2, plus 2 seeds x 4 recipes x 3
    total = 2 * 2 * 2 * 2 + 2 * 4 * 3
    bars = re.findall(r"casgd_recipes:.*?(\d+)/(\d+)", done.stderr)
    assert bars[-1] == (str(total), str(total))
    sweeps = re.findall(r"eta sweep.*?(\d+)/(\d+)", done.stderr)   # 9 etas x 2 seeds x 10
    assert sweeps and sweeps[-1] == ("180", "180")


@pytest.mark.slow
def test_precision_assignment_writes_to_a_temporary_directory_by_default(tmp_path):
    before = digests(RESULTS)
    done = subprocess.run([sys.executable, str(EXAMPLES / "precision_assignment.py"),
                           "--epochs", "1", "--seeds", "1", "--width", "2", "--batch", "256"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert digests(RESULTS) == before and list(tmp_path.iterdir()) == []
    out = pathlib.Path(re.search(r"^wrote \S+ in (\S+)$", done.stderr, re.M).group(1))
    assert sorted(p.name for p in out.iterdir()) == [
        "precision_assignment.json", "precision_assignment.md", "precision_assignment.png"]
    assert json.loads((out / "precision_assignment.json").read_text())["args"]["out"] == str(out)


@pytest.mark.parametrize("script, args, message", [
    ("rounding_error_vs_precision.py", ["--format", "nonsense"],
     "argument --format: unknown format 'nonsense'"),
    ("rounding_error_vs_precision.py", ["--steps", "0"],
     "argument --steps: 0 is not accepted; accepted: an integer >= 1"),
    ("casgd_recipes.py", ["--b", "0"], "argument --b: 0 is not accepted"),
    ("casgd_recipes.py", ["--eta", "-1"], "argument --eta: -1.0 is not accepted"),
    ("casgd_recipes.py", ["--losses", "hinge"], "argument --losses: invalid choice: 'hinge'"),
    ("optim_papers.py", ["--runs", "0"], "argument --runs: 0 is not accepted"),
    ("train_lm.py", ["--heads", "3"], "--d-model 64 is not a multiple of --heads 3"),
    ("train_lm.py", ["--device", "nonsense"], "argument --device: 'nonsense' is not a torch"),
    ("precision_assignment.py", ["--lr", "-1"], "argument --lr: -1.0 is not accepted"),
    ("train_recipes.py", ["--d-model", "48", "--heads", "4"],
     "--d-model 48 and --batch x --context 1024 must be multiples of 32"),
    ("train_recipes.py", ["--runs", "fp4"], "argument --runs: invalid choice: 'fp4'"),
    ("tensor_core_error.py", ["--max-k", "16"],
     "argument --max-k: 16 is not accepted; accepted: an integer >= 32"),
    # each once a traceback (or a write outside --out) after or during the run
    ("precision_assignment.py", ["--name", "../escaped", "--out", "inner"],
     "argument --name: '../escaped' is not accepted; accepted: a file name without folders"),
    ("precision_assignment.py", ["--batch", "2000"],
     "--batch 2000 is more than the 1347 training rows"),
    ("train_lm.py", ["--runs"], "--runs names no run; accepted: one or more of 'FP32'"),
    ("train_recipes.py", ["--runs"], "--runs names no run; accepted: one or more of 'bf16'"),
    ("train_lm.py", ["--runs", "FP32", "--data-bytes", "100"],
     "--data-bytes 100 leaves 10 bytes for validation, fewer than --context 64 + 2"),
    ("train_lm.py", ["--replot", "missing.json"], "argument --replot: 'missing.json' is not "
                                                  "a file"),
    ("tensor_core_error.py", ["--max-k", str(2 ** 64)],
     "argument --max-k: 18446744073709551616 is not accepted; accepted: an integer 1 .. "
     "134217728"),
    ("casgd_recipes.py", ["--n", "2", "--P", "64"], "--P 64 is more than --n 2"),
    ("casgd_recipes.py", ["--margin-std", "1e300"], "argument --margin-std: 1e+300 is not "
                                                    "accepted; accepted: a number from 0 to 100"),
])
def test_examples_refuse_bad_arguments_by_name(tmp_path, monkeypatch, capsys, script, args,
                                               message):
    """argparse's usage error (status 2, the option named), not a traceback from deep in
    the run, and nothing written (main(argv) in this process: one import of torch)."""
    import importlib.util
    monkeypatch.setattr(sys, "path", list(sys.path))     # the examples extend it on import
    spec = importlib.util.spec_from_file_location(f"example_{script[:-3]}", EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        module.main(args)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("script, args, files", [
    ("train_recipes.py", ["--steps", "2", "--batch", "2", "--context", "16", "--d-model", "32",
                          "--layers", "1", "--heads", "2", "--data-bytes", "20000",
                          "--eval-every", "1", "--val-batches", "1", "--runs", "nvfp4"],
     ["train_recipes.json", "train_recipes.md", "train_recipes.png"]),
    ("tensor_core_error.py", ["--rows", "4", "--max-k", "64"],
     ["tensor_core_error.json", "tensor_core_error.md", "tensor_core_error.png"]),
])
def test_examples_without_out_write_to_a_temporary_directory(tmp_path, script, args, files):
    """The README's promise: without --out a new temporary directory, printed at the end;
    nothing in the working directory or the committed results.  (train_lm.py: in the test
    below, whose --replot runs without --out.)"""
    before = digests(RESULTS)
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=tmp_path,
                          env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out = pathlib.Path(re.search(r"^wrote (\S+)/" + re.escape(files[-1]), done.stdout,
                                 re.M).group(1))
    assert sorted(p.name for p in out.iterdir()) == files
    assert digests(RESULTS) == before and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_train_lm_with_out_writes_its_json_and_replots_from_it(tmp_path):
    """--out is a path: the JSON of the runs once failed on it after the whole training."""
    tiny = ["--steps", "2", "--batch", "2", "--context", "8", "--d-model", "8", "--layers",
            "1", "--heads", "2", "--data-bytes", "20000", "--eval-every", "1",
            "--val-batches", "1", "--runs", "FP32"]
    script = str(EXAMPLES / "train_lm.py")
    done = subprocess.run([sys.executable, script, *tiny, "--out", str(tmp_path / "a")],
                          env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    saved = json.loads((tmp_path / "a" / "train_lm.json").read_text())
    assert saved["args"]["out"] == str(tmp_path / "a") and saved["args"]["steps"] == 2
    # without --out (one training serves both promises): a new temporary directory, nothing
    # in the working directory or the committed results
    before = digests(RESULTS)
    (tmp_path / "cwd").mkdir()
    again = subprocess.run([sys.executable, script, "--replot", str(tmp_path / "a" /
                            "train_lm.json")], cwd=tmp_path / "cwd",
                           env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    out = pathlib.Path(re.search(r"^wrote (\S+)/train_lm.png", again.stdout, re.M).group(1))
    assert out.is_dir() and not out.is_relative_to(tmp_path) and out != RESULTS
    assert sorted(p.name for p in out.iterdir()) == ["train_lm.json", "train_lm.md",
                                                      "train_lm.png"]
    assert digests(RESULTS) == before and list((tmp_path / "cwd").iterdir()) == []
