"""argparse types shared by the example scripts: each names what it accepts, so a bad
option is argparse's usage error (status 2, the option named), not a traceback."""

import argparse


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse names the option in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not accepted; accepted: an integer >= 1")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} is not accepted; accepted: a finite "
                                         "number > 0")
    return value


def seed_int(text: str) -> int:
    """argparse type: a seed, an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not accepted; accepted: an integer >= 0")
    return value


def device_name(text: str) -> str:
    """argparse type: a torch device this machine has (cpu, or cuda where CUDA is)."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device; accepted: cpu or "
                                         "cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: this machine has no CUDA device; "
                                         "accepted: cpu")
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r} is not accepted; accepted: cpu or cuda")
    return text


def int_in(low: int, high: int):
    """argparse type: an integer ``low`` .. ``high``."""
    def checked(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not accepted; accepted: an integer "
                                             f"{low} .. {high}")
        return value
    checked.__name__ = f"integer {low} .. {high}"
    return checked


def int_at_most(top: int):
    """argparse type: an integer 1 .. ``top``."""
    return int_in(1, top)


def out_folder(text: str):
    """argparse type: an output folder (made if missing), not an existing file: checked
    before any work, rather than found by mkdir at the end."""
    import pathlib
    path = pathlib.Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; accepted: a folder (made if "
                                         "missing)")
    return path


def file_stem(text: str) -> str:
    """argparse type: a file name without a folder (written inside --out, never beside)."""
    import pathlib
    if not text or pathlib.PurePath(text).name != text or text in (".", ".."):
        raise argparse.ArgumentTypeError(f"{text!r} is not accepted; accepted: a file name "
                                         "without folders (the files go into --out)")
    return text


def existing_file(text: str):
    """argparse type: a file that exists."""
    import pathlib
    path = pathlib.Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    return path


def output_file(text: str) -> str:
    """argparse type: a file to write, in a folder that exists (checked before any work,
    rather than found when the results are written at the end)."""
    import pathlib
    path = pathlib.Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; accepted: a file path")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: the folder {str(path.parent)!r} does not "
                                         "exist")
    return text
