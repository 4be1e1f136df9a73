"""Which ops run these kernels under ``torch.compile``, and which give their computation back to Inductor.

Eager calls always run the kernels.  While Dynamo traces (``is_compiling()``), each op's functional entry
reads its route here: ``"kernels"`` records the registered ``torch.library`` op (Inductor traces into its
Triton launches), ``"inductor"`` writes the op's PyTorch reference into the graph, for Inductor to generate
and fuse with its neighbours (a norm with the residual add and the casts around it, which a kernel of its
own cannot join).  The choice is made at trace time: changing it takes effect at the next compile
(``torch._dynamo.reset()``).  Attention is not here: Inductor does not generate attention, and where SDPA
is the faster kernel the modules call it in both modes (``prefer_sdpa`` in ``attention.py``).

A user sets other routes with ``fused_layers.set_compiled_routes(mlp="kernels")`` (the Lightning callback's
``compiled_routes``) before the model compiles; Dynamo guards on the table, so a compiled frame traced under
other routes compiles again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

Route = Literal["kernels", "inductor"]


@dataclass(frozen=True)
class CompiledRoutes:
    """The route of each op under ``torch.compile`` (read by its functional entry while Dynamo traces)."""

    layer_norm: Route
    rms_norm: Route
    rms_norm_variant: Route  #: the transformers RMSNorm look-alikes (``fused_rms_norm_variant``)
    softmax: Route
    cross_entropy: Route  #: ``fused_cross_entropy`` and transformers' causal-LM loss on given logits
    linear_cross_entropy: Route  #: the LM head + loss, chunked (the demo's loss module, transformers' causal LMs)
    gated_activation: Route  #: transformers' gated MLPs (the look-alikes; the functional op always runs the kernels)
    mlp: Route  #: the plain MLPs of GPT-2, timm and ``register_mlp`` (the look-alikes; the functional op likewise)
    residual_norm: Route  #: transformers' decoder layers' residual add + norm (the look-alikes, likewise)


COMPILED = CompiledRoutes(
    # Inductor's generated LayerNorm fuses the residual add and the dtype casts around the norm into one kernel,
    # which a separate kernel cannot do (GPT-2 small, H200, B16 x 1024: Inductor's norms 1.78 ms of GPU time a
    # step, these kernels 2.09 ms plus 0.69 ms for the residual add Inductor then writes out).
    layer_norm="inductor",
    # The same neighbours and the same fusion as LayerNorm (an RMSNorm is a LayerNorm without mean and bias).
    rms_norm="inductor",
    # What these look-alikes have always run under compile (Inductor traces into the kernels); Inductor's own
    # norm beside the residual add is the alternative the GPU benchmark decides between.
    rms_norm_variant="kernels",
    # What the softmax has always run under compile: one kernel per row block, forward and backward.
    softmax="kernels",
    # What the loss has always run under compile: loss and gradient in one pass over the logits, read in their
    # own dtype (the gradient written in the forward, no float32 copy of the logits).
    cross_entropy="kernels",
    # A fusion Inductor cannot do: its graph holds the (N, V) logits of the LM head (and the loss's float32 copy
    # of them), the chunked kernel never more than one chunk of them.
    linear_cross_entropy="kernels",
    # act(gate) * up is pointwise: Inductor makes it one kernel with its neighbours (compiled Gemma and Qwen2 with
    # any one kind but the loss left to Inductor stepped as fast as with all of them, docs/performance.md). Its
    # partitioner keeps the product for the down projection's weight gradient, one intermediate-width tensor a
    # layer that the kernels' op with the projection writes again in the backward instead: compiled Llama 3, Qwen2
    # and Gemma (H100) 13-19 % less extra peak for 0.3-1.3 % of the step, so it is the user's choice.
    gated_activation="inductor",
    # Likewise act(h) of a plain MLP. The kernels' route took the compiled demo GPT-2 (16 x 1,024, H100) from 5.84 to
    # 4.71 GiB of peak but from 1.002x to 0.985x [0.964-0.995] of unfused: slower, so it is the user's choice.
    mlp="inductor",
    # The add and the norm are what Inductor fuses into one kernel for the norms above.
    residual_norm="inductor",
)


ROUTES = ("kernels", "inductor")


def check_routes(routes: dict) -> dict[str, Route]:
    """``routes`` checked against the table's fields: a ``TypeError`` for an op it does not have, a ``ValueError``
    for a route other than ``"kernels"`` / ``"inductor"``, each naming what is allowed."""
    ops = [f.name for f in dataclasses.fields(CompiledRoutes)]
    for op, r in routes.items():
        if op not in ops:
            raise TypeError(f"compiled routes: no op {op!r}; ops: {', '.join(ops)}")
        if r not in ROUTES:
            raise ValueError(f"compiled routes: {op}={r!r}; a route is one of {', '.join(ROUTES)}")
    return dict(routes)


def set_routes(**routes: Route) -> CompiledRoutes:
    """Route these ops under ``torch.compile`` from now on (``mlp="kernels"``: the plain MLPs' activation is not
    kept for the backward, less memory for a slightly longer step); returns the table before, for
    ``set_routes(**dataclasses.asdict(before))``.  Graphs compile again under the new table (Dynamo guards on it)."""
    global COMPILED
    before = COMPILED
    COMPILED = dataclasses.replace(COMPILED, **check_routes(routes))
    return before


def route(op: str) -> Route:
    """The route of ``op`` (a field of ``CompiledRoutes``) under ``torch.compile``."""
    return getattr(COMPILED, op)
