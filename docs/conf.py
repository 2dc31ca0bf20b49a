"""Sphinx configuration: lpsim's API reference, generated from the docstrings."""

import importlib.util
import os
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))                         # document this checkout's lpsim
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")    # lpsim_cuda imports without a GPU

import lpsim  # noqa: E402

project = "lpsim"
copyright = "2026, the lpsim authors"
release = version = lpsim.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon",
              "sphinx.ext.viewcode"]
autosummary_generate = True                 # one page per module, found by walking the packages
autosummary_ignore_module_all = True
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# optional packages document without being installed; an installed one is never mocked (a
# mocked torch breaks scipy, which checks for torch arrays; qtorch compiles at import)
autodoc_mock_imports = ["qtorch"] + [name for name in ("torch", "torchao", "gfloat")
                                     if importlib.util.find_spec(name) is None]
napoleon_google_docstring = True
napoleon_numpy_docstring = True
exclude_patterns = ["_build"]
suppress_warnings = ["ref.python"]   # the same short name (e.g. Result) in several modules

html_theme = "furo"
html_title = f"lpsim {release}"
templates_path = ["_templates"]

# --- docstrings are plain text with a little reST ------------------------------------------
# lpsim's docstrings write maths as text: "|x|", "coef_", "kernel(*args)".  Outside
# ``literals``, `roles` and literal blocks these are escaped, so reST does not read them as
# substitutions, link targets or emphasis.
_QUOTED = re.compile(r"(``.*?``|`[^`]*`_?)")


def _escape_text(part: str) -> str:
    part = re.sub(r"(?<!\\)\|", r"\\|", part)
    part = re.sub(r"(?<=\w)_(?=[\s.,;:)\]]|$)", r"\\_", part)
    return re.sub(r"(?<=[(\s,\[])(\*{1,2})(?=[A-Za-z_]\w*[,)\]])",
                  lambda m: "\\*" * len(m.group(1)), part)


def _plain_text(app, what, name, obj, options, lines):
    literal_indent = None
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None and (not line.strip() or indent > literal_indent):
            continue                                           # inside a literal block
        literal_indent = None
        stripped = line.strip()
        if not stripped.startswith(("..", ">>>", "+-", "==")) and not set(stripped) <= set("=- "):
            parts = _QUOTED.split(line)
            parts[::2] = [_escape_text(p) for p in parts[::2]]
            lines[i] = "".join(parts)
        if stripped.endswith("::"):
            literal_indent = indent


def _skip_foreign(app, what, name, obj, skip, options):
    """Members that scikit-learn adds to the estimators (set_fit_request, ...) are its own."""
    if getattr(obj, "__module__", "") and str(getattr(obj, "__module__", "")).startswith(
            "sklearn"):
        return True
    return None


def setup(app):
    app.connect("autodoc-process-docstring", _plain_text, priority=400)   # before napoleon
    app.connect("autodoc-skip-member", _skip_foreign)
