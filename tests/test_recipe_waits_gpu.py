"""A simulated training step on a GPU makes the host wait for the device nowhere.

GPU only (LPSIM_TEST_GPU=1): a file of its own, so that gpu_session.sh's workers (one file
each) run it beside test_torch_recipes.py rather than after it.
"""

import os
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from lpsim.torch import PRESETS, simulate  # noqa: E402

GPU = os.environ.get("LPSIM_TEST_GPU") == "1"


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 32))


@pytest.mark.skipif(not GPU, reason="the host's waits for a GPU: on a GPU (LPSIM_TEST_GPU=1)")
@pytest.mark.parametrize("name", list(PRESETS))
def test_a_gpu_training_step_never_makes_the_host_wait(name, monkeypatch):
    """After two warm-up steps (kernels compiled, launch routes built and checked), a
    forward and backward pass of a simulated model, telemetry on, makes the host wait for
    the GPU nowhere: no torch synchronisation (torch.cuda.set_sync_debug_mode), no numba
    stream or context synchronisation, no copy to the host.  A wait drains the queue that
    hides the host's time per call; each one found is named with the lines that made it."""
    import pathlib
    import traceback
    from numba.cuda.cudadrv import devicearray, driver
    waits = []

    def watch(owner, attr):
        real = getattr(owner, attr)

        def waiting(*args, **kwargs):
            frames = [f for f in traceback.extract_stack()[:-1] if "lpsim" in f.filename]
            waits.append(f"{owner.__name__}.{attr} from " + " <- ".join(
                f"{pathlib.Path(f.filename).name}:{f.lineno}" for f in frames[::-1][:4]))
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, attr, waiting)

    for owner, attr in ((driver.Stream, "synchronize"), (driver.Context, "synchronize"),
                        (devicearray.DeviceNDArray, "copy_to_host")):
        watch(owner, attr)
    model = simulate(mlp().cuda(), name, generator=1)
    x = torch.randn(64, 32, device="cuda")

    def step():
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
    step()
    step()
    torch.cuda.synchronize()
    waits.clear()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    waits += [f"torch: {w.message} at {pathlib.Path(w.filename).name}:{w.lineno}"
              for w in caught if "synchroniz" in str(w.message)]
    assert not waits, f"{name}: the host waited {len(waits)} times:\n" + "\n".join(waits)
