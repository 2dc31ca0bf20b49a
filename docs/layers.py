"""Draw the layers of lpsim from the import-linter contract in pyproject.toml.

``python docs/layers.py`` prints the diagram; ``python docs/layers.py --write`` puts it into
docs/architecture.rst between its ``.. layers-begin`` and ``.. layers-end`` comments.  The
contract is the source (``lint-imports`` holds the code to it); tests/test_layers.py checks
that the page shows the contract as it is.

A row is a layer, top to bottom; lpsim's modules on the left, lpsim_cuda's on the right;
the room names (apps, features, front, ...) are the ``# name:`` comments above a layer in
the contract.
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.rst"
BEGIN, END = ".. layers-begin", ".. layers-end"
CONTRACT = "layers"


def _toml():
    try:
        import tomllib
    except ImportError:                 # Python 3.10: import-linter brings tomli there
        import tomli as tomllib
    return tomllib


def layers(pyproject: pathlib.Path = ROOT / "pyproject.toml") -> list[tuple[str, str]]:
    """(room, layer) of the layers contract, top to bottom; room is "" where the layer
    continues the room above."""
    text = pyproject.read_text()
    config = _toml().loads(text)
    contract = next(c for c in config["tool"]["importlinter"]["contracts"]
                    if c.get("id") == CONTRACT)
    # the room comments: "# name: ..." lines inside the contract's layers list
    block = text[text.index(f'id = "{CONTRACT}"'):]
    block = block[block.index("layers = ["):block.index("\n]")]
    rooms, room = {}, ""
    for line in block.splitlines():
        named = re.match(r"\s*#\s*(\w+):", line)
        layer = re.match(r'\s*"([^"]+)"', line)
        if named:
            room = named.group(1)
        elif layer:
            rooms[layer.group(1)] = room
            room = ""
    return [(rooms.get(layer, ""), layer) for layer in contract["layers"]]


def _split(layer: str) -> tuple[str, str, str]:
    """(lpsim part, separator, lpsim_cuda part) of a layer, short names."""
    sep = ":" if ":" in layer else "|"
    names = [name.strip() for name in layer.split(sep)]
    cpu = [n.removeprefix("lpsim.") for n in names if not n.startswith("lpsim_cuda")]
    cuda = [n.removeprefix("lpsim_cuda.") for n in names if n.startswith("lpsim_cuda")]
    return f" {sep} ".join(cpu), sep, f" {sep} ".join(cuda)


def diagram(rows: list[tuple[str, str]] | None = None) -> str:
    """The text diagram of ``rows`` (default: the contract's layers)."""
    rows = layers() if rows is None else rows
    parts = [(room, *_split(layer)) for room, layer in rows]
    label = max(len(room) for room, *_ in parts) + 3
    left = max(len(cpu) for _, cpu, _, cuda in parts if cuda) + 2
    lines = [" " * (3 + label) + "lpsim".ljust(left + 3) + "lpsim_cuda"]
    for i, (room, cpu, sep, cuda) in enumerate(parts):
        arrow = "▼" if i == len(parts) - 1 else "│"
        row = f" {arrow} {room.ljust(label)}{cpu}"
        if cuda:
            row = f"{row.ljust(3 + label + left)}{sep}  {cuda}" if cpu else \
                f"{row.ljust(3 + label + left)}   {cuda}"
        lines.append(row.rstrip())
    return "\n".join(lines) + "\n"


def block(text: str) -> str:
    """The diagram as the page's literal block."""
    body = "".join(f"   {line}\n" if line else "\n" for line in text.splitlines())
    return f"{BEGIN}\n\n.. code-block:: text\n\n{body}\n{END}"


def page_block(page: pathlib.Path = PAGE) -> str:
    """What the page holds between its markers (markers included)."""
    text = page.read_text()
    return text[text.index(BEGIN):text.index(END) + len(END)]


def write(page: pathlib.Path = PAGE) -> None:
    text = page.read_text()
    page.write_text(text.replace(page_block(page), block(diagram())))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.stdout.write(diagram())
