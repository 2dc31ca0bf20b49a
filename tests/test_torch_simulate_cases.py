"""lpsim.torch.simulate in the situations training code puts it in: activation checkpointing,
skipped layers with keep_first_last, nested and odd-token inputs, ``skip`` as users write it.
"""

import copy

import pytest

import lpsim

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from lpsim.torch import Gemm, Operand, Recipe, SimulatedLinear, report, simulate  # noqa: E402

#: a forward operand rounded stochastically, so a recompute that drew new bits would differ
SR_FORWARD = Recipe(Gemm(Operand("mxfp8", "stochastic"), Operand("mxfp8")),
                    Gemm(Operand("mxfp8"), Operand("mxfp8")),
                    Gemm(Operand("mxfp8"), Operand("mxfp8")), name="sr-forward")


def mlp(width=32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width),
                         nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))


def _steps(recipe, checkpointed, reentrant=False, steps=2):
    """Two SGD steps of a simulated MLP whose first blocks are checkpointed or not: the
    parameters, the telemetry and the generator's state at the end."""
    model = simulate(mlp(), recipe, generator=lpsim.Generator(5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # an input that takes a gradient: the reentrant checkpoint needs one to run backward
    x = torch.randn(32, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
    for _ in range(steps):
        inner = model[:4]
        h = checkpoint(inner, x, use_reentrant=reentrant) if checkpointed else inner(x)
        model[4:](h).square().mean().backward()
        opt.step()
        opt.zero_grad()
    gen = model[0].generator.get_state()
    return [p.detach().clone() for p in model.parameters()], report(model).rows, gen


@pytest.mark.parametrize("recipe, reentrant", [("fp8_delayed", False), ("nvfp4", False),
                                               (SR_FORWARD, False), (SR_FORWARD, True)])
def test_activation_checkpointing_replays_the_forward(recipe, reentrant):
    # the recompute draws the forward's counters, uses its delayed scales and counts
    # nothing: every step equals the step without checkpointing, telemetry included
    plain, checked = _steps(recipe, False), _steps(recipe, True, reentrant)
    assert all(torch.equal(a, b) for a, b in zip(plain[0], checked[0]))
    assert plain[1] == checked[1]
    assert plain[2] == checked[2]


def test_a_forward_inside_a_backward_pass_of_other_shapes_runs_afresh():
    # nothing remembered matches: it is a forward of its own, counted and drawing anew
    layer = SimulatedLinear.from_linear(nn.Linear(32, 32), SR_FORWARD,
                                        generator=lpsim.Generator(1))
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append(layer(torch.ones(32, 32)).sum().item())
            return g

    before = layer.telemetry["fprop", "x"].elements
    Probe.apply(torch.ones(4, 32, requires_grad=True)).sum().backward()
    assert layer.telemetry["fprop", "x"].elements == before + 32 * 32 and len(seen) == 1


def test_keep_first_last_counts_skipped_layers():
    # the first and last linear layers of the model, whatever skip leaves plain
    def recipes(model):
        return [m.recipe.name if isinstance(m, SimulatedLinear) else "plain"
                for m in model if isinstance(m, nn.Linear)]
    assert recipes(simulate(mlp(), "nvfp4")) == ["bf16", "nvfp4", "nvfp4", "bf16"]
    assert recipes(simulate(mlp(), "nvfp4", skip=["6"])) == ["bf16", "nvfp4", "nvfp4", "plain"]
    assert recipes(simulate(mlp(), "nvfp4", skip=["0"])) == ["plain", "nvfp4", "nvfp4", "bf16"]


def test_skip_as_users_write_it():
    assert isinstance(simulate(mlp(), "mxfp8", skip=None)[0], SimulatedLinear)
    shared = nn.Linear(32, 32)
    model = nn.Sequential(shared, nn.ReLU(), shared)     # one layer in two places
    simulate(model, "mxfp8", skip=["2"])                  # its second place's name
    assert model[0] is shared and model[2] is shared
    for bad in (3, [0], [None]):
        with pytest.raises(TypeError, match="skip=.*accepted: module names"):
            simulate(mlp(), "mxfp8", skip=bad)


def test_a_nested_input_is_refused_by_name():
    layer = SimulatedLinear.from_linear(nn.Linear(8, 8), "bf16", name="fc")
    nested = torch.nested.nested_tensor([torch.ones(2, 8), torch.ones(3, 8)])
    with pytest.raises(ValueError, match="layer 'fc': input is a nested tensor"):
        layer(nested)


@pytest.mark.parametrize("grad", ["no_grad", "frozen weight"])
def test_tokens_that_k_by_k_blocks_do_not_divide_are_refused_before_anything(grad):
    op2d = Operand("nvfp4", blocks_2d=True)
    recipe = Recipe(Gemm(op2d, Operand("nvfp4")), Gemm(op2d, Operand("nvfp4")),
                    Gemm(Operand("nvfp4"), Operand("nvfp4")))
    layer = SimulatedLinear.from_linear(nn.Linear(32, 32), recipe, name="fc")
    x = torch.randn(20, 32, requires_grad=grad != "no_grad")
    if grad == "frozen weight":
        layer.weight.requires_grad_(False)
    counted = copy.deepcopy(layer.telemetry)
    with pytest.raises(ValueError, match=r"layer 'fc': fprop\.a\.fmt: 16 x 16 blocks of x"):
        with torch.no_grad() if grad == "no_grad" else torch.enable_grad():
            layer(x)
    assert {k: v.elements for k, v in layer.telemetry.items()} == \
        {k: v.elements for k, v in counted.items()}


def test_from_linear_leaves_the_layer_it_copies_as_it_was():
    # a reference layer the user keeps: none of lpsim's hooks, and the simulated layer's
    # hooks do not fire on it; hooks it had fire on the simulated layer
    linear = nn.Linear(32, 32)
    seen = []
    linear.register_forward_hook(lambda module, args, out: seen.append("theirs"))
    before = {key: dict(value) for key, value in vars(linear).items()
              if "hook" in key and isinstance(value, dict)}
    layer = SimulatedLinear.from_linear(linear, "mxfp8")
    layer.register_forward_hook(lambda module, args, out: seen.append("simulated"))
    assert {key: dict(getattr(linear, key)) for key in before} == before
    with torch.no_grad():
        linear(torch.ones(4, 32))
        assert seen == ["theirs"]
        layer(torch.ones(4, 32))
    assert seen == ["theirs", "theirs", "simulated"]


def test_attributes_set_on_a_replaced_layer_stay():
    model = mlp()
    model[2].init_std, model[2]._is_hf_initialized = 0.02, True
    simulate(model, "mxfp8")
    assert isinstance(model[2], SimulatedLinear)
    assert (model[2].init_std, model[2]._is_hf_initialized) == (0.02, True)


@pytest.mark.parametrize("recipe", ["fp8_delayed", "nvfp4", SR_FORWARD])
def test_a_run_resumed_with_its_simulation_state_equals_the_uninterrupted_run(recipe):
    from lpsim.torch import load_simulation_state, simulation_state

    def step(model, opt, i):
        x = torch.randn(32, 32, generator=torch.Generator().manual_seed(i))
        (model(x).square().mean() * 1e-4).backward()    # small gradients: scaling matters
        opt.step()
        opt.zero_grad()

    run = simulate(mlp(), recipe, generator=lpsim.Generator(3))
    opt = torch.optim.SGD(run.parameters(), lr=0.1)
    for i in range(3):
        step(run, opt, i)
    saved = copy.deepcopy((run.state_dict(), simulation_state(run)))
    resumed = simulate(mlp(), recipe, generator=lpsim.Generator(3))
    resumed.load_state_dict(saved[0])
    load_simulation_state(resumed, saved[1])
    opt2 = torch.optim.SGD(resumed.parameters(), lr=0.1)
    for i in range(3, 5):
        step(run, opt, i)
        step(resumed, opt2, i)
    assert all(torch.equal(a, b) for a, b in zip(run.parameters(), resumed.parameters()))


def test_a_simulation_state_of_another_model_is_refused_and_changes_nothing():
    from lpsim.torch import load_simulation_state, simulation_state
    model = simulate(mlp(), "fp8_delayed")
    model(torch.randn(32, 32)).sum().backward()
    before = simulation_state(model)
    other = simulation_state(simulate(nn.Sequential(nn.Linear(32, 32)), "fp8_delayed"))
    with pytest.raises(ValueError, match="do not match the model's simulated layers"):
        load_simulation_state(model, other)
    wrong = copy.deepcopy(before)
    wrong["layers"]["6"]["recipe"] = "mxfp8"
    with pytest.raises(ValueError, match="layer '6' is of recipe 'mxfp8'"):
        load_simulation_state(model, wrong)
    with pytest.raises(ValueError, match="accepted: the dictionary"):
        load_simulation_state(model, {"layers": {}})
    after = simulation_state(model)
    assert after["layers"].keys() == before["layers"].keys()
    for name, entry in before["layers"].items():
        assert after["layers"][name]["steps"] == entry["steps"]
        assert after["layers"][name]["generator"] == entry["generator"]


def test_a_simulation_state_with_values_a_layer_cannot_take_is_refused_by_name():
    from lpsim.torch import load_simulation_state, simulation_state
    model = simulate(mlp(), "fp8_delayed")
    model(torch.randn(32, 32)).sum().backward()
    good = simulation_state(model)
    changes = [("steps", 2 ** 70), ("generator", 5)]
    for field, value in changes:
        bad = copy.deepcopy(good)
        bad["layers"]["2"][field] = value
        with pytest.raises(ValueError, match="layer '2' is not accepted"):
            load_simulation_state(model, bad)
    bad = copy.deepcopy(good)
    bad["layers"]["2"]["sites"]["fprop.x"]["history"] = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="1-D float32 amax history"):
        load_simulation_state(model, bad)
    assert [e["steps"] for e in simulation_state(model)["layers"].values()] == \
        [e["steps"] for e in good["layers"].values()]
