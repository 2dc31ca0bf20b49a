"""Every python code block of the user guide runs, one page per fresh interpreter.

The guide is the ``.rst`` (and any ``.md``) pages under ``docs/``; the API reference there is
generated from the docstrings and has no pages of its own in git.  A python block is
``.. code-block:: python`` (or a ```python fence in a ``.md`` page).

How the blocks run, and why: tests/test_readme.py runs each README block in an interpreter of
its own, as a reader pastes one block into ``python``.  A guide page is read top to bottom, so
here the blocks of one page run in order in ONE fresh interpreter, in one namespace, like a
doctest session: a later block may use what an earlier block of the same page defined.  The
trade is deliberate.  Each interpreter start imports numpy and numba (often torch, scipy and
scikit-learn too) and loads kernels from numba's cache, a few seconds each; one start per page
instead of one per block keeps the docs' share of CI time small.  What the session loses is the
check that each block imports what it uses on its own; the README's blocks keep that check.

A block that needs what CI lacks says so on a line of its own, as in the README:
``# requires: cuda`` (it runs with LPSIM_TEST_GPU=1) or ``# requires: torchrun`` (never here).
Such a block is left out of its page's session, so no later block may depend on it.  The
process starts in an empty directory with this checkout's lpsim first on the path and the
suite's environment (NUMBA_CACHE_DIR included).

Also checked: each page's code blocks use a language this test knows (so no python hides in a
block that is never run), and every image the README or a page shows exists.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*") if p.suffix in (".rst", ".md")
               and not {"_build", "api", "_templates"} & set(p.relative_to(DOCS).parts))
REQUIRES = re.compile(r"^#\s*requires:\s*(\w+)\s*$", re.M)
DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\.\. (?P<kind>code-block|code|sourcecode)::"
                       r"[ \t]*(?P<lang>\S*)[ \t]*$")
FENCE = re.compile(r"^```(?P<lang>\S*)\n(?P<body>.*?)^```", re.S | re.M)
# languages whose blocks are shown, not run; anything else is refused by name
SHOWN = {"bash", "console", "text", "none"}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def code_blocks(page: pathlib.Path) -> list[tuple[str, str]]:
    """(language, source) of each code block of ``page``, in order."""
    text = page.read_text(encoding="utf-8")
    if page.suffix == ".md":
        return [(m["lang"], m["body"]) for m in FENCE.finditer(text)]
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        match = DIRECTIVE.match(lines[i])
        i += 1
        if not match:
            continue
        base, body = len(match["indent"]), []
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
            body.append(lines[i])
            i += 1
        while body and not body[0].strip():
            body.pop(0)
        while body and re.match(r"\s*:[\w-]+:", body[0]):     # directive options
            body.pop(0)
        lang = match["lang"] if match["kind"] == "code-block" else f"{match['kind']}:{match['lang']}"
        blocks.append((lang, textwrap.dedent("\n".join(body)).strip("\n") + "\n"))
    return blocks


# runs in the child: each block in turn in one namespace, named in tracebacks as page:block
SESSION = r"""
import json, sys, traceback
page, blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
for index, source in blocks:
    try:
        exec(compile(source, f"<{page} block {index}>", "exec"), namespace)
    except BaseException:
        print(f"{page}: code block {index} failed:\n{source}", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def run_session(name: str, blocks: list[tuple[int, str]], cwd):
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", SESSION], input=json.dumps([name, blocks]),
                          cwd=cwd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": path})


def page_id(page: pathlib.Path) -> str:
    return str(page.relative_to(DOCS))


def test_the_guide_has_pages_with_python_blocks():
    runnable = [p for p in PAGES if any(lang == "python" for lang, _ in code_blocks(p))]
    assert len(runnable) >= 6, [page_id(p) for p in runnable]


def test_block_parser(tmp_path):
    page = ("Title\n=====\n\n.. code-block:: python\n   :caption: x\n\n   a = 1\n\n"
            "   if a:\n       b = 2\n\nText.\n\n  .. code-block:: bash\n\n     ls\n")
    (tmp_path / "page.rst").write_text(page, encoding="utf-8")
    assert code_blocks(tmp_path / "page.rst") == [("python", "a = 1\n\nif a:\n    b = 2\n"),
                                                  ("bash", "ls\n")]


def test_a_session_shares_one_namespace_and_stops_at_a_failure(tmp_path):
    done = run_session("p", [(0, "import sys, lpsim\nx = 2\n"),
                             (1, "assert x == 2 and 'lpsim.ops' not in sys.modules\n"
                                 "print(lpsim.__file__)\n")], tmp_path)
    assert done.returncode == 0, done.stderr
    assert pathlib.Path(done.stdout.strip()) == ROOT / "lpsim" / "__init__.py"
    assert not any(tmp_path.iterdir())
    done = run_session("p", [(0, "y = 1\n"), (1, "raise ValueError('no')\n"), (2, "print(9)")],
                       tmp_path)
    assert done.returncode == 1 and "p: code block 1 failed" in done.stderr
    assert "ValueError: no" in done.stderr and "9" not in done.stdout


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_code_blocks_have_known_languages(page):
    for index, (lang, _) in enumerate(code_blocks(page)):
        assert lang == "python" or lang in SHOWN, (
            f"{page_id(page)} block {index}: language {lang!r}; use '.. code-block:: python' "
            f"(it runs) or one of {sorted(SHOWN)} (shown only)")


@pytest.mark.parametrize("page", [p for p in PAGES
                                  if any(lang == "python" for lang, _ in code_blocks(p))],
                         ids=page_id)
def test_page_python_blocks_run(page, tmp_path):
    blocks, left_out = [], []
    for index, (lang, source) in enumerate(code_blocks(page)):
        if lang != "python":
            continue
        needs = set(REQUIRES.findall(source))
        unknown = needs - {"cuda", "torchrun"}
        assert not unknown, f"{page_id(page)} block {index}: unknown '# requires:' {unknown}"
        if "torchrun" in needs or ("cuda" in needs and os.environ.get("LPSIM_TEST_GPU") != "1"):
            left_out.append(index)
        else:
            blocks.append((index, source))
    if not blocks:
        pytest.skip(f"every python block needs a GPU or torchrun: {left_out}")
    done = run_session(page_id(page), blocks, tmp_path)
    assert done.returncode == 0, done.stderr[-6000:]


IMAGE_RST = re.compile(r"^\s*\.\. (?:image|figure)::\s*(\S+)\s*$", re.M)
IMAGE_MD = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
LINK_MD = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s#]+)(?:#[^)]*)?\)")


def test_images_and_local_links_exist():
    shown = [(ROOT / "README.md", m) for m in IMAGE_MD.findall(
        (ROOT / "README.md").read_text(encoding="utf-8"))]
    shown += [(ROOT / "README.md", m) for m in LINK_MD.findall(
        (ROOT / "README.md").read_text(encoding="utf-8")) if "://" not in m]
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        shown += [(page, m) for m in IMAGE_RST.findall(text) + IMAGE_MD.findall(text)]
    missing = [f"{src.relative_to(ROOT)}: {target}" for src, target in shown
               if not (src.parent / target).resolve().exists()]
    assert len(shown) >= 5 and not missing, missing
