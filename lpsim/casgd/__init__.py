"""CA-SGD for generalized linear models with nine precision slots (Devarakonda et al. 2026)."""

from .._extras import require

require("scipy", extra="casgd", feature="lpsim.casgd")

from .bound import LocalErrorBound, higham_gamma, local_error_bound, local_error_bounds
from .cost import cost_model
from .data import load_dataset, load_libsvm, make_synth, normalize_rows
from .estimators import CASGDClassifier, CASGDRegressor
from .losses import LOSSES, Loss, get_loss
from .recipes import RECIPES, SLOTS, Recipe, Slot, as_recipe
from .sampling import PhiloxIndices
from .solvers import DivergedError, Result, block_columns, casgd, casgd_step, sgd
from .tuning import EtaSweep, sweep_eta

__all__ = ["casgd", "sgd", "casgd_step", "Result", "block_columns", "Recipe", "Slot", "RECIPES",
           "SLOTS", "as_recipe", "LOSSES", "Loss", "get_loss", "local_error_bound",
           "local_error_bounds", "LocalErrorBound", "higham_gamma", "cost_model", "make_synth",
           "load_libsvm", "load_dataset", "normalize_rows", "CASGDClassifier",
           "CASGDRegressor", "sweep_eta", "EtaSweep", "DivergedError", "PhiloxIndices"]
