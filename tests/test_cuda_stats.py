"""RoundingStats across GPU launches: one reused device accumulator, reads ordered after the
streams that wrote it, and buffers that exist before a CUDA graph capture needs them.

Runs under the CUDA simulator (streams there are bookkeeping only, so the stream tests check
which streams a read waits for); test_cuda_gpu.py checks the ordering on a real device.
"""

import numpy as np
import pytest
from numba import cuda

import lpsim
import lpsim_cuda
from lpsim_cuda import counters
from lpsim_cuda.launch import SIMULATOR

FMT = lpsim.fp(4, 3, 2)


def values(n=64, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 100


def cpu_counts(*arrays):
    stats = lpsim.RoundingStats()
    for x in arrays:
        lpsim.quantize(x, FMT, stats=stats)
    return stats.as_dict()


class RecordingStream:
    """Stands in for a numba stream: records the synchronisations asked of it."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def synchronize(self):
        self.log.append(self.name)


#: the stream tests hand numba stand-in streams, which only the simulator launches on
simulator_only = pytest.mark.skipif(not SIMULATOR, reason="stand-in streams need the simulator")


@pytest.fixture
def sync_log(monkeypatch):
    log = []
    monkeypatch.setattr(counters.cuda, "synchronize", lambda: log.append("device"))
    return log


def on_stream(x, stream):
    array = cuda.to_device(x)
    array.stream = stream         # as an array made with cuda.to_device(x, stream=stream)
    return array


def test_launches_reuse_one_accumulator_and_allocate_nothing(monkeypatch):
    x, out = cuda.to_device(values()), cuda.to_device(np.zeros(64, np.float32))
    stats = lpsim.RoundingStats()
    lpsim_cuda.quantize(x, FMT, stats=stats, out=out)
    lpsim_cuda.quantize(x, FMT, out=out)                  # makes the scratch buffer
    allocations = []
    for name in ("to_device", "device_array", "device_array_like"):
        monkeypatch.setattr(cuda, name, lambda *a, _n=name, **k: allocations.append(_n))
    for _ in range(3):
        lpsim_cuda.quantize(x, FMT, stats=stats, out=out)
        lpsim_cuda.quantize(x, FMT, out=out)
    monkeypatch.undo()
    assert allocations == [] and list(stats._devices) == [0]
    assert stats.as_dict() == {k: 4 * v for k, v in cpu_counts(values()).items()}


def test_reset_iadd_as_dict_and_repr_see_device_counts():
    a, b = values(seed=1), values(seed=2)
    stats, other = lpsim.RoundingStats(), lpsim.RoundingStats()
    lpsim_cuda.quantize(cuda.to_device(a), FMT, stats=stats)
    stats.reset()                                       # zeroes the device side too
    lpsim_cuda.quantize(cuda.to_device(b), FMT, stats=stats)
    assert stats.as_dict() == cpu_counts(b)
    lpsim_cuda.quantize(cuda.to_device(a), FMT, stats=other)
    lpsim.quantize(b, FMT, stats=other)                 # CPU counts add to the same object
    stats += other
    assert stats.as_dict() == cpu_counts(b, a, b)
    assert repr(stats) == repr(lpsim.RoundingStats(**cpu_counts(b, a, b)))


@simulator_only
def test_a_read_waits_for_the_one_stream_that_wrote(sync_log):
    stream = RecordingStream(sync_log, "s1")
    stats = lpsim.RoundingStats()
    for seed in range(2):
        lpsim_cuda.quantize(on_stream(values(seed=seed), stream), FMT, stats=stats)
    assert stats.elements == 128 and sync_log == ["s1"]
    assert stats.as_dict() == cpu_counts(values(seed=0), values(seed=1)) and sync_log == ["s1"]


@simulator_only
def test_a_read_after_two_streams_waits_for_the_device(sync_log):
    stats = lpsim.RoundingStats()
    for name in ("s1", "s2"):
        lpsim_cuda.quantize(on_stream(values(), RecordingStream(sync_log, name)), FMT,
                            stats=stats)
    assert stats.as_dict() == cpu_counts(values(), values()) and sync_log == ["device"]
    lpsim_cuda.quantize(on_stream(values(), RecordingStream(sync_log, "s3")), FMT, stats=stats)
    assert stats.elements == 192 and sync_log == ["device", "s3"]    # one stream again


@simulator_only
def test_capture_needs_warmed_up_buffers_and_keeps_reading_after_it(sync_log, monkeypatch):
    monkeypatch.setattr(counters, "_SCRATCH", {})
    monkeypatch.setattr(counters, "_CAPTURED", [])
    stats = lpsim.RoundingStats()
    capturing = lambda: True                                          # noqa: E731
    with pytest.raises(RuntimeError, match=r"call lpsim_cuda.warmup\(\) before capturing"):
        counters.launch_counts(None, 0, 0, capturing)
    with pytest.raises(RuntimeError, match=r"warmup\(stats=stats\) before capturing"):
        counters.launch_counts(stats, 0, 0, capturing)
    lpsim_cuda.warmup(stats=[stats])
    scratch, count = counters.launch_counts(None, 0, 0, capturing)
    assert count is False and scratch is counters._SCRATCH[0]
    buffer, count = counters.launch_counts(stats, 0, 0, capturing)
    assert count is True and counters._CAPTURED == [buffer]           # kept alive for replays
    buffer[1] = 5                    # what a replay nobody saw would add to 'overflow'
    assert stats.overflow == 5 and sync_log == ["device"]
    buffer[1] = 2
    assert stats.overflow == 7 and sync_log == ["device", "device"]  # read again: replays


def test_pickled_stats_carry_the_totals():
    import pickle
    stats = lpsim.RoundingStats()
    lpsim_cuda.quantize(cuda.to_device(values()), FMT, stats=stats)
    copy = pickle.loads(pickle.dumps(stats))
    assert copy == stats and copy._devices == {} and copy.as_dict() == cpu_counts(values())


def test_a_numpy_numba_cuda_cannot_compile_with_is_refused_at_import(monkeypatch):
    """numba-cuda 0.30.4 registers np.row_stack; numpy 2.5 removed it (seen on an H100)."""
    import numba_cuda
    import numpy

    from lpsim_cuda import launch

    def registry_that_needs_row_stack():
        raise AttributeError("module 'numpy' has no attribute 'row_stack'")

    monkeypatch.setattr(launch, "SIMULATOR", False)
    launch.check_numpy(registry_that_needs_row_stack)          # numpy still has row_stack
    monkeypatch.delattr(numpy, "row_stack", raising=False)
    with pytest.raises(ImportError, match=rf"numba-cuda {numba_cuda.__version__} cannot "
                                          r"compile kernels with numpy .*numpy<2\.5"):
        launch.check_numpy(registry_that_needs_row_stack)
    launch.check_numpy(lambda: None)                            # a numba-cuda that copes
