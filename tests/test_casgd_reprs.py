"""Slot and Recipe reprs name presets (formats and recipes A-I) and evaluate back."""

import pytest

from lpsim.casgd import RECIPES, Recipe, Slot

SCOPE = {"RECIPES": RECIPES, "Recipe": Recipe, "Slot": Slot}


def test_preset_recipes_print_their_name():
    for key, recipe in RECIPES.items():
        assert repr(recipe) == f"RECIPES[{key!r}]"
        assert eval(repr(recipe), SCOPE) is recipe
    assert repr(Recipe(*"b b b f f b b f f".split(), name="C")) == "RECIPES['C']"


@pytest.mark.parametrize("recipe, text", [
    (RECIPES["C"].replace(u_AR_r="f"), "RECIPES['C'].replace(u_AR_r=Slot('fp32'))"),
    (RECIPES["I"].replace(u_x="fp32", name="I, fp32 weights"),
     "RECIPES['I'].replace(u_x=Slot('fp32'), name='I, fp32 weights')"),
    (Recipe(*"b b b f f b b f f".split()), "RECIPES['C'].replace(name='custom')"),
    (RECIPES["A"].replace(u_r=Slot("e4m3fn", acc="fp(6,9,0)", rounding="stochastic")),
     "RECIPES['A'].replace(u_r=Slot('e4m3fn', acc='fp(6,9,0)', rounding='stochastic'))"),
])
def test_recipes_near_a_preset_print_the_change(recipe, text):
    assert repr(recipe) == text
    assert eval(text, SCOPE) == recipe


def test_other_recipes_print_every_slot():
    recipe = Recipe.uniform("fp(6,5,0)")
    text = repr(recipe)
    assert text.startswith("Recipe(u_A=Slot('fp(6,5,0)'), u_G=Slot('fp(6,5,0)'),")
    assert text.endswith("name='uniform fp(6,5,0)')")
    assert eval(text, SCOPE) == recipe


def test_slot_reprs():
    assert repr(RECIPES["C"].u_r) == "Slot('bf16', acc='fp32', out='bf16')"
    assert repr(RECIPES["F"].u_G) == "Slot('fp16')"          # "ha": FP16 accumulation
    assert repr(Slot("fp32")) == "Slot('fp32')"
    for slot in (RECIPES["C"].u_r, Slot("e5m2", acc="fp16", rounding="stochastic")):
        assert eval(repr(slot), SCOPE) == slot
