"""The RHT of lpsim.torch.hadamard: its defined order, the CPU's fused transposing pass equal
to torch's operations bit for bit, exactness and its error bound."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lpsim.torch.hadamard import (hadamard, rht, rht_signs, rht_tokens,  # noqa: E402
                                  rht_transposed)


def sylvester(v):
    """H v along the last axis by the Sylvester recursion H_2k v = [H_k (a+b), H_k (a-b)]."""
    if v.shape[-1] == 1:
        return v
    a, b = np.split(v, 2, axis=-1)
    with np.errstate(all="ignore"):         # inf - inf: NaN, as in torch
        return np.concatenate([sylvester(a + b), sylvester(a - b)], axis=-1)


def signs_of(n, seed=3):
    return rht_signs(seed, 1, 2, n)


def hard_values(shape, seed=0):
    """float32 values with every kind of hard case: signed zeros, subnormals, the largest
    finite values (sums overflow), infinities and NaNs, among normal numbers."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape))).astype(np.float32)
    flat = x.reshape(-1)
    special = np.array([0.0, -0.0, 1e-45, -3e-42, 1.1754942e-38, 3.4028235e38, -3.4028235e38,
                        np.inf, -np.inf, np.nan], np.float32)
    where = rng.choice(flat.size, size=min(flat.size // 4, 400), replace=False)
    flat[where] = rng.choice(special, size=where.size)
    return x


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        a.view(np.uint32 if a.dtype == np.float32 else np.uint64),
        b.view(np.uint32 if b.dtype == np.float32 else np.uint64))


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64])
def test_rht_is_the_sylvester_recursion_in_the_tensors_dtype(n):
    for dtype in (np.float32, np.float64):
        x = hard_values((6, 4 * n)).astype(dtype)
        s = signs_of(n)
        want = sylvester(x.reshape(-1, n) * (s * dtype(1 / np.sqrt(n))).astype(dtype))
        got = rht(torch.from_numpy(x), s).numpy()
        # NaNs compare by position: a NaN's payload is torch's and numpy's own choice
        assert np.array_equal(np.isnan(got), np.isnan(want.reshape(x.shape)))
        assert same_bits(np.nan_to_num(got), np.nan_to_num(want.reshape(x.shape)))


@pytest.mark.parametrize("n", [2, 16, 32])
@pytest.mark.parametrize("shape", [(64, 48), (32, 37), (4096, 33), (16, 1)])
def test_the_cpus_pass_equals_torchs_operations_bit_for_bit(n, shape):
    """The threaded pass along the tokens (threads split 4096 tokens into runs) gives rht of
    the transposed copy, in the input's layout (rht_tokens) and as the transpose's rows
    (rht_transposed), NaNs where it has them."""
    tokens = shape[0] - shape[0] % n or n
    x = torch.from_numpy(hard_values((tokens, shape[1]), seed=n))
    s = signs_of(n)
    want = rht(x.t().contiguous(), s)
    along = rht_tokens(x, s)
    assert along.is_contiguous() and along.shape == x.shape
    assert along.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert same_bits(along.t().nan_to_num().numpy(), want.nan_to_num().numpy())
    got = rht_transposed(x, s)
    assert got.is_contiguous() and got.shape == (x.shape[1], x.shape[0])
    assert torch.equal(got.isnan(), want.isnan())
    assert same_bits(got.nan_to_num().numpy(), want.nan_to_num().numpy())
    # a tensor of signs on the device, a non-contiguous input, a float64 input (torch's path)
    row = torch.from_numpy(s).float()
    assert torch.equal(rht_transposed(x, row).nan_to_num(), got.nan_to_num())
    assert same_bits(rht_tokens(x, row).numpy(), along.numpy())
    wide = torch.from_numpy(hard_values((tokens, 2 * shape[1]), seed=1))
    view = wide[:, ::2]
    xd = x.double()
    for other in (view, xd):
        want = rht(other.t().contiguous(), s).nan_to_num()
        assert torch.equal(rht_transposed(other, s).nan_to_num(), want)
        assert torch.equal(rht_tokens(other, s).t().nan_to_num(), want)


def test_small_integers_transform_exactly():
    """With n = 16 the factors are +-1/4 and every sum of 16 small integers / 4 is exact: the
    result equals H diag(d) x / 4 in float64."""
    n = 16
    x = np.random.default_rng(1).integers(-1000, 1000, (64, 40)).astype(np.float32)
    s = signs_of(n)
    want = (x.T.astype(np.float64).reshape(-1, n) @ (hadamard(n) * s).T / 4).reshape(40, 64)
    assert np.array_equal(rht_transposed(torch.from_numpy(x), s).numpy(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_tensor_that_requires_grad_keeps_its_graph_and_its_bits(dtype):
    """The float32 CPU pass detached its input: a tensor that requires grad got a result
    without grad_fn.  Now both transforms keep the graph, with rht's bits, and backward
    gives rht's gradient: (H diag(d) / 4)^T g, exact for small integers g at n = 16."""
    n = 16
    s = signs_of(n)
    x = torch.from_numpy(hard_values((64, 40), seed=5)).to(dtype)
    rng = np.random.default_rng(2)
    g = torch.from_numpy(rng.integers(-1000, 1000, (64, 40)).astype(np.float32)).to(dtype)
    want = rht(x.t().contiguous(), s).nan_to_num()
    for transform, as_rows in ((rht_tokens, lambda y: y.t()), (rht_transposed, lambda y: y)):
        leaf = x.clone().requires_grad_(True)
        y = transform(leaf, s)
        assert y.grad_fn is not None
        assert same_bits(as_rows(y).detach().nan_to_num().numpy(), want.numpy())
        as_rows(y).backward(g.t().contiguous())
        ref = x.clone().requires_grad_(True)
        rht(ref.t().contiguous(), s).backward(g.t().contiguous())
        assert same_bits(leaf.grad.numpy(), ref.grad.numpy())
        runs = g.double().numpy().T.reshape(-1, n)
        exact = (runs @ (hadamard(n) * s) / 4).reshape(40, 64).T
        assert np.array_equal(leaf.grad.double().numpy(), exact)
        with torch.no_grad():           # no graph wanted (float32: the fast pass), same bits
            y = transform(leaf, s)
        assert y.grad_fn is None
        assert same_bits(as_rows(y).nan_to_num().numpy(), want.numpy())


@pytest.mark.parametrize("n, error", [(3, ValueError), (6, ValueError), (12, ValueError),
                                      (0, ValueError), (-8, ValueError), (2.5, TypeError),
                                      (4.0, TypeError), (True, TypeError), ("4", TypeError)])
def test_hadamard_refuses_a_size_that_is_not_a_power_of_two(n, error):
    """hadamard(6) was 8 x 8, hadamard(0) 1 x 1 and hadamard(2.5) 4 x 4, without an error."""
    with pytest.raises(error, match=rf"hadamard: n={n!r} is not accepted; accepted: .*a power "
                                    "of two >= 1"):
        hadamard(n)
    for size in (1, 2, 16, np.int64(32)):
        h = hadamard(size)
        assert h.shape == (size, size) and np.array_equal(h @ h.T, size * np.eye(size))


@pytest.mark.parametrize("n", [4, 16, 32])
def test_each_output_is_within_the_trees_error_bound(n):
    """|fl(y) - y| <= gamma(k) * sum_j |c_j x_j|, y the exact H (c x) with the float32 factors
    c: a tree of depth log2(n), plus the products' own rounding where c is not a power of two
    (n = 32): k = log2(n) (+1).  Seeded normal data; the bound is proven, so it cannot flake."""
    x = (np.random.default_rng(n).standard_normal((8 * n, 24)) * 100).astype(np.float32)
    s = signs_of(n)
    c = (s * np.float32(1 / np.sqrt(n))).astype(np.float32)
    runs = x.T.astype(np.float64).reshape(-1, n)
    exact = runs @ (hadamard(n) * c.astype(np.float64)).T
    depth = int(np.log2(n)) + (0 if np.log2(n) % 2 == 0 else 1)
    u = 2.0 ** -24
    gamma = depth * u / (1 - depth * u)
    limit = gamma * (np.abs(runs) @ np.abs(np.ones((n, n)) * c).T)
    got = rht_transposed(torch.from_numpy(x), s).numpy().astype(np.float64).reshape(-1, n)
    assert (np.abs(got - exact) <= limit).all()
    assert not np.array_equal(got, exact)        # rounding happened: the bound was tested


@pytest.mark.parametrize("bad", [(48, 16, 12), (40, 16, 16), (16, 8, 3)])
def test_a_size_that_does_not_divide_the_tokens_is_refused_by_value(bad):
    tokens, features, n = bad
    x = torch.zeros(tokens, features)
    signs = np.ones(n)
    with pytest.raises(ValueError, match=f"RHT of size {n} is not accepted along an axis of "
                                         f"{tokens}"):
        rht_transposed(x, signs)
    with pytest.raises(ValueError, match=f"RHT of size {n} is not accepted"):
        rht_tokens(x, signs)
    with pytest.raises(ValueError, match=f"size {n}"):
        rht(x.t().contiguous(), signs)


@pytest.mark.parametrize("shape", [(32,), (2, 16, 4)])
@pytest.mark.parametrize("transform", [rht_transposed, rht_tokens])
def test_a_tensor_that_is_not_2d_is_refused(shape, transform):
    with pytest.raises(ValueError, match=r"shape \(.*\) is not accepted; accepted: a 2-D"):
        transform(torch.zeros(shape), np.ones(16))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("transform", [rht, rht_transposed, rht_tokens])
def test_a_tensor_that_is_not_floating_point_is_refused(dtype, transform):
    """An integer tensor would take the factor fl(1/sqrt(n)) as 0: refused by its dtype."""
    with pytest.raises(TypeError, match=f"dtype {dtype} is not accepted; accepted: a floating"):
        transform(torch.ones(16, 2, dtype=dtype), np.ones(16))


def test_a_0d_tensor_is_refused():
    with pytest.raises(ValueError, match="a 0-d tensor is not accepted"):
        rht(torch.tensor(1.0), np.ones(16))


def test_factors_of_a_cpu_float32_row_equal_those_of_its_signs():
    """A layer's signs come as a float32 row of its window (numpy's product there): the
    factors equal those made from the numpy signs by torch, bit for bit, for every size."""
    from lpsim.torch.hadamard import factors
    for n in (2, 16, 32, 64, 128):
        signs = rht_signs(5, 2, 7, n)
        want = factors(signs, torch.float32, "cpu")
        got = factors(torch.from_numpy(signs).float(), torch.float32, "cpu")
        assert got.dtype == torch.float32 and torch.equal(got.view(torch.int32),
                                                          want.view(torch.int32)), n


@pytest.mark.parametrize("args, error, match", [
    ((0, 2 ** 64, 0, 16), ValueError, r"layer=18446744073709551616 is not accepted"),
    ((0, -1, 0, 16), ValueError, r"layer=-1 is not accepted"),
    ((0, 0, -1, 16), ValueError, r"step=-1 is not accepted"),
    ((0, 0, 2 ** 61, 16), ValueError, r"step=2305843009213693952 is not accepted"),
    ((0, 0, 0, 0), ValueError, r"n=0 is not accepted; accepted: 1 <= n"),
    ((0, 1.0, 0, 16), TypeError, r"layer=1\.0 is not accepted; accepted: an integer"),
    ((0, True, 0, 16), TypeError, r"layer=True"),
])
def test_rht_signs_refuse_what_would_wrap_or_be_empty(args, error, match):
    """A layer past the 64-bit stream wrapped onto another layer's signs; n <= 0 gave no
    signs."""
    with pytest.raises(error, match=match):
        rht_signs(*args)
    assert np.array_equal(rht_signs(0, np.int64(3), np.uint64(5), 16), rht_signs(0, 3, 5, 16))
