"""Simulated attention projections: ``nn.MultiheadAttention`` with a recipe's GEMMs.

:class:`SimulatedMultiheadAttention` runs the four projections of an
``nn.MultiheadAttention`` (q, k and v of its inputs, and the output's) as simulated linear
maps (:class:`lpsim.torch.gemms.LinearGemms`), each a GEMM of its own with its own name
(``<module>.q_proj``, ``.k_proj``, ``.v_proj``, ``.out_proj``), telemetry, step count and
RHT index.  The q, k and v weights are the rows of ``in_proj_weight`` (or
``q_proj_weight``, ``k_proj_weight`` and ``v_proj_weight`` when kdim or vdim differ from
embed_dim), so their gradients flow into the module's own Parameters.

Between the projections, the attention itself (bias_k and bias_v, add_zero_attn, the masks,
the scaled scores, softmax, dropout, the weights averaged over heads) runs in ordinary torch,
the same operations in the same order as ``torch.nn.functional.multi_head_attention_forward``:
with the projections exact, outputs and attention weights equal ``nn.MultiheadAttention``'s
bit for bit where query, key and value are different tensors (given one tensor as two or
three of them, torch projects them by one packed GEMM, which BLAS may sum in another order:
float32 rounding apart).  The module never takes ``nn.MultiheadAttention``'s inference fast path
(``torch._native_multi_head_attention``, which runs the projections inside), and its no-op
forward pre-hook keeps ``nn.TransformerEncoderLayer`` out of its own fast path, which reads
the projection weights directly.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..generator import Generator
from .gemms import (MODULE_STATE, LinearGemms, adopt_module_state, check_float_input,
                    gemms_to_run)
from .recipes import recipe as as_recipe

#: the projections of an attention module, in the order their GEMMs run and are indexed
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
#: what nn.Module.__init__ makes: a module of its own for each simulated one, the rest copied
def _shape(t) -> tuple:
    return tuple(t.shape)


class SimulatedMultiheadAttention(nn.MultiheadAttention):
    """An ``nn.MultiheadAttention`` whose four projections follow a recipe; it holds the
    original's Parameters and out_proj module (the same state_dict keys).

    Made by :func:`lpsim.torch.simulate` with ``attention=True`` (or
    :meth:`from_attention`).  ``projections``: the :class:`lpsim.torch.gemms.LinearGemms`
    of ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``; ``telemetry``: per (projection,
    gemm, operand) the counters so far.  ``forward`` takes the arguments of
    ``nn.MultiheadAttention.forward`` and returns what it returns.  What it cannot run
    (shapes that do not fit, masks neither bool nor floating, is_causal without attn_mask,
    nested tensors, which only torch's inference fast path takes, token counts the recipe's
    blocks do not divide) is refused with an error naming the value and what is accepted,
    before anything is drawn or counted.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("make a SimulatedMultiheadAttention with SimulatedMultiheadAttention."
                        "from_attention(attention, recipe) or lpsim.torch.simulate(model, "
                        "recipe, attention=True)")

    @classmethod
    def from_attention(cls, attention: nn.MultiheadAttention, recipe, *,
                       generator: Generator | None = None, name: str = "", index: int = 0,
                       telemetry: bool | int = True):
        """The simulated module of ``attention`` (its Parameters, shared); the projections'
        layer indices (the RHT's streams) are index .. index + 3."""
        r = as_recipe(recipe)
        cls.check(attention, r, name)
        generator = generator if generator is not None else Generator()
        projections = {p: LinearGemms(r, generator=generator, name=_join(name, p),
                                      index=index + i, telemetry=telemetry)
                       for i, p in enumerate(PROJECTIONS)}
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        for key, value in vars(attention).items():
            if key in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
                getattr(self, key).update(value)          # the same Parameters, in order
            elif key == "training" or key not in MODULE_STATE:
                self.__dict__[key] = value
        self.layer_name, self.projections = name, projections
        adopt_module_state(self, attention)
        return self

    @classmethod
    def check(cls, attention: nn.MultiheadAttention, recipe, name: str = "") -> None:
        """Refuse what :meth:`from_attention` cannot simulate (before anything is made): not
        an nn.MultiheadAttention, a subclass with a forward of its own (which the simulated
        forward would replace), projection sizes the recipe's blocks do not divide."""
        if not isinstance(attention, nn.MultiheadAttention):
            raise TypeError(f"attention={type(attention).__name__}: accepted: an "
                            "nn.MultiheadAttention")
        if not isinstance(attention, cls) and \
                type(attention).forward is not nn.MultiheadAttention.forward:
            raise ValueError(f"module {name!r} is a {type(attention).__name__}, an "
                             "nn.MultiheadAttention subclass with its own forward, which the "
                             "simulated module's would replace; accepted: nn.MultiheadAttention"
                             f" and subclasses that keep its forward (skip=[{name!r}])")
        r = as_recipe(recipe)
        for p, (in_features, out_features) in _dims(attention).items():
            r.check_dims(in_features, out_features, where=f"layer {_join(name, p)!r}: ")

    @property
    def recipe(self):
        return self.projections["q_proj"].recipe

    def gemm_layers(self) -> dict:
        """The simulated linear maps of this module by name suffix (report's rows)."""
        return dict(self.projections)

    @property
    def telemetry(self) -> dict:
        return {(p, *key): stats for p, g in self.projections.items()
                for key, stats in g.telemetry.items()}

    def reset_telemetry(self) -> None:
        for g in self.projections.values():
            g.reset_telemetry()

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, " \
               f"recipe={self.recipe.name!r}"

    def _in_weights(self):
        """The q, k and v weights and biases: rows (views) of the packed Parameters."""
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight.chunk(3)
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        b = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
        return w, b

    def _project(self, p: str, x: torch.Tensor, weight, bias) -> torch.Tensor:
        y = self.projections[p].linear(x.reshape(-1, x.shape[-1]), weight, bias)
        return y.reshape(*x.shape[:-1], y.shape[-1]).to(self.projections[p].output_dtype(x))

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        """(attn_output, attn_weights or None) as ``nn.MultiheadAttention.forward``; the
        steps between the projections are those of
        ``torch.nn.functional.multi_head_attention_forward``."""
        batched = self._check(query, key, value, key_padding_mask, attn_mask, is_causal)
        if key_padding_mask is not None and attn_mask is not None and \
                key_padding_mask.dtype != attn_mask.dtype:
            warnings.warn("Support for mismatched key_padding_mask and attn_mask is "
                          "deprecated. Use same type for both instead.", stacklevel=2)
        kpm = _float_mask(key_padding_mask, query.dtype)
        attn_mask = _float_mask(attn_mask, query.dtype)
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            kpm = kpm.unsqueeze(0) if kpm is not None else None
        elif self.batch_first:
            query, key, value = query.transpose(1, 0), key.transpose(1, 0), value.transpose(1, 0)
        tgt_len, bsz, embed_dim = query.shape
        w, b = self._in_weights()
        self._check_tokens(query, key, value, w, tgt_len * bsz, key.shape[0] * bsz)

        if is_causal and kpm is None and not need_weights:
            attn_mask = None            # scaled_dot_product_attention's own causal mask
        elif kpm is not None:
            is_causal = False           # the merged mask is no longer causal
        q = self._project("q_proj", query, w[0], b[0])
        k = self._project("k_proj", key, w[1], b[1])
        v = self._project("v_proj", value, w[2], b[2])
        if attn_mask is not None and attn_mask.dim() == 2:
            attn_mask = attn_mask.unsqueeze(0)
        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, self.bias_k.repeat(1, bsz, 1)])
            v = torch.cat([v, self.bias_v.repeat(1, bsz, 1)])
            attn_mask = F.pad(attn_mask, (0, 1)) if attn_mask is not None else None
            kpm = F.pad(kpm, (0, 1)) if kpm is not None else None
        heads, head_dim = self.num_heads, self.head_dim
        q = q.view(tgt_len, bsz * heads, head_dim).transpose(0, 1)
        k = k.view(k.shape[0], bsz * heads, head_dim).transpose(0, 1)
        v = v.view(v.shape[0], bsz * heads, head_dim).transpose(0, 1)
        if self.add_zero_attn:
            zeros = (bsz * heads, 1, head_dim)
            k = torch.cat([k, torch.zeros(zeros, dtype=k.dtype, device=k.device)], dim=1)
            v = torch.cat([v, torch.zeros(zeros, dtype=v.dtype, device=v.device)], dim=1)
            attn_mask = F.pad(attn_mask, (0, 1)) if attn_mask is not None else None
            kpm = F.pad(kpm, (0, 1)) if kpm is not None else None
        src_len = k.size(1)
        if kpm is not None:
            kpm = kpm.view(bsz, 1, 1, src_len).expand(-1, heads, -1, -1).reshape(
                bsz * heads, 1, src_len)
            attn_mask = kpm if attn_mask is None else attn_mask + kpm
        dropout_p = self.dropout if self.training else 0.0

        if need_weights:
            q_scaled = q * math.sqrt(1.0 / float(head_dim))
            if attn_mask is not None:
                weights = torch.baddbmm(attn_mask, q_scaled, k.transpose(-2, -1))
            else:
                weights = torch.bmm(q_scaled, k.transpose(-2, -1))
            weights = F.softmax(weights, dim=-1)
            if dropout_p > 0.0:
                weights = F.dropout(weights, p=dropout_p)
            out = torch.bmm(weights, v).transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
            weights = weights.view(bsz, heads, tgt_len, src_len)
            if average_attn_weights:
                weights = weights.mean(dim=1)
            if not batched:
                weights = weights.squeeze(0)
        else:
            if attn_mask is not None:
                if attn_mask.size(0) == 1 and attn_mask.dim() == 3:
                    attn_mask = attn_mask.unsqueeze(0)
                else:
                    attn_mask = attn_mask.view(bsz, heads, -1, src_len)
            out = F.scaled_dot_product_attention(
                q.view(bsz, heads, tgt_len, head_dim), k.view(bsz, heads, src_len, head_dim),
                v.view(bsz, heads, src_len, head_dim), attn_mask, dropout_p, is_causal)
            out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
            weights = None
        out = self._project("out_proj", out, self.out_proj.weight, self.out_proj.bias)
        out = out.view(tgt_len, bsz, out.size(1))
        if not batched:
            return out.squeeze(1), weights
        return (out.transpose(1, 0) if self.batch_first else out), weights

    def _check(self, query, key, value, key_padding_mask, attn_mask, is_causal) -> bool:
        """Refuse, naming the value and what is accepted, what cannot run; True when the
        inputs are batched."""
        where = f"attention {self.layer_name!r}: "
        tensors = {"query": query, "key": key, "value": value,
                   "key_padding_mask": key_padding_mask, "attn_mask": attn_mask}
        for what, t in tensors.items():
            if t is not None and not isinstance(t, torch.Tensor):
                raise TypeError(f"{where}{what}={type(t).__name__}: accepted: a tensor"
                                + ("" if what in ("query", "key", "value") else " or None"))
            if t is not None and t.is_nested:
                raise ValueError(
                    f"{where}{what} is a nested tensor, which only nn.MultiheadAttention's "
                    "inference fast path takes, and that path runs no simulated GEMM; "
                    "accepted: a padded tensor with key_padding_mask (nn.TransformerEncoder "
                    "makes nested tensors in eval mode: build it with "
                    "enable_nested_tensor=False)")
        if query.dim() not in (2, 3):
            raise ValueError(f"{where}query of shape {_shape(query)}; accepted: (L, E) "
                             "unbatched, (L, N, E), or (N, L, E) with batch_first")
        batched = query.dim() == 3
        for what, t in (("key", key), ("value", value)):
            if t.dim() != query.dim():
                raise ValueError(f"{where}{what} of shape {_shape(t)} with a "
                                 f"{query.dim()}-D query; accepted: a {query.dim()}-D {what}")
        feature = {"query": self.embed_dim, "key": self.kdim, "value": self.vdim}
        for what, t in (("query", query), ("key", key), ("value", value)):
            check_float_input(t, what, where)
            if t.shape[-1] != feature[what]:
                raise ValueError(f"{where}{what} of shape {_shape(t)}: its last dimension "
                                 f"is {t.shape[-1]}; accepted: {feature[what]}")
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(f"{where}key of shape {_shape(key)} and value of shape "
                             f"{_shape(value)}; accepted: the same sequence and batch sizes")
        seq = 1 if batched and self.batch_first else 0
        bsz = query.shape[1 - seq] if batched else 1
        if batched and key.shape[1 - seq] != bsz:
            raise ValueError(f"{where}query of shape {_shape(query)} and key of shape "
                             f"{_shape(key)}; accepted: the same batch size")
        tgt_len, src_len = query.shape[seq], key.shape[seq]
        for what, mask in (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask)):
            if mask is not None and mask.dtype != torch.bool and not mask.is_floating_point():
                raise ValueError(f"{where}{what} of dtype {mask.dtype}; accepted: bool "
                                 "(True: not attended) or a floating dtype (added)")
        if key_padding_mask is not None:
            want = (bsz, src_len) if batched else (src_len,)
            if _shape(key_padding_mask) != want:
                raise ValueError(f"{where}key_padding_mask of shape "
                                 f"{_shape(key_padding_mask)}; accepted: {want}")
        if attn_mask is not None:
            accepted = [(tgt_len, src_len), (bsz * self.num_heads, tgt_len, src_len)]
            if _shape(attn_mask) not in accepted:
                raise ValueError(f"{where}attn_mask of shape {_shape(attn_mask)}; accepted: "
                                 f"{accepted[0]} or {accepted[1]} (batch x num_heads, L, S)")
        if is_causal and attn_mask is None:
            raise ValueError(f"{where}is_causal=True needs attn_mask (nn.MultiheadAttention "
                             "takes is_causal as a hint about the mask given); accepted: "
                             "attn_mask=nn.Transformer.generate_square_subsequent_mask(L) "
                             "with is_causal=True, or is_causal=False")
        return batched

    def _check_tokens(self, query, key, value, w, tgt_tokens: int, src_tokens: int):
        """The recipe's refusal of the token counts (wgrad's K, k x k blocks of x and dy)
        for the GEMMs each projection and its backward pass will run, before any runs."""
        inputs = {"q_proj": (query, w[0], tgt_tokens), "k_proj": (key, w[1], src_tokens),
                  "v_proj": (value, w[2], src_tokens)}
        for p, (x, weight, tokens) in inputs.items():
            self.projections[p].check_dims(x.shape[-1], self.embed_dim, tokens,
                                           gemms_to_run(x.requires_grad, weight))
        # the attention's output takes a gradient where anything before it does
        upstream = any(t.requires_grad for t in (query, key, value, *w) if t is not None)
        self.projections["out_proj"].check_dims(
            self.embed_dim, self.embed_dim, tgt_tokens,
            gemms_to_run(upstream, self.out_proj.weight))


def _join(name: str, projection: str) -> str:
    return f"{name}.{projection}" if name else projection


def _dims(attention: nn.MultiheadAttention) -> dict:
    """(in_features, out_features) of each projection."""
    e = attention.embed_dim
    return {"q_proj": (e, e), "k_proj": (attention.kdim, e), "v_proj": (attention.vdim, e),
            "out_proj": (e, e)}


def _float_mask(mask, dtype):
    """A bool mask as the float mask nn.MultiheadAttention makes of it (-inf where True)."""
    if mask is None or mask.is_floating_point():
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask, float("-inf"))


__all__ = ["SimulatedMultiheadAttention", "PROJECTIONS"]
