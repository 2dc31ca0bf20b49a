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
