"""The PyTorch reference of every nabla op the differential test generates
(test/differential.py): evaluate(name, args) computes one op in its inputs'
floating dtype (float64, or float32 for the native f32 comparison).

Arguments are as in the runner's program text: variables (anything with a
torch value in .t), numbers and lists. Integer variables hold int64 or integral
float64 values, bools torch.bool.

Where nabla documents or keeps a policy that differs from PyTorch, the
reference follows nabla; each such place says so. Most are NaN conventions at
NaN inputs, or the one-sided limits at -0.

The elementwise ops are read from nabla's one list, lib/core/ops.def: every
public op there needs its reference here (UNARY, SCALAR, BINARY, COMPARE, by
the form of its public function), and importing this module fails, naming
the op, when one is missing or names an op the list does not have.
"""

import math
import os
import re

import torch
import torch.nn.functional as F

OPS_DEF = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "lib", "core", "ops.def")


def listed_ops(path=OPS_DEF):
    """The public elementwise ops of ops.def, in the list's order, by the form
    of their public function: unary nb_<name>(x), scalar nb_<name>(x, alpha),
    binary nb_<name>(a, b) (arithmetic) and compare (a bool result). Internal
    ops have no public function, so no program can name them."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    ops = {"unary": [], "scalar": [], "binary": [], "compare": []}
    for name, api in re.findall(r"^NB_UNARY\(\s*\w+\s*,\s*(\w+)\s*,\s*\w+\s*,\s*\w+\s*,\s*(\w+)\s*\)", text, re.M):
        if api in ("X", "XA"):
            ops["unary" if api == "X" else "scalar"].append(name)
    for name, kind, api in re.findall(
            r"^NB_BINARY\(\s*\w+\s*,\s*(\w+)\s*,\s*\w+\s*,\s*\w+\s*,\s*(\w+)\s*,\s*(\w+)\s*\)", text, re.M):
        if api != "INTERNAL":
            ops["compare" if kind == "CMP" else "binary"].append(name)
    if not ops["unary"] or not ops["binary"]:
        raise RuntimeError(f"differential_ref.py: no elementwise ops read from {path}")
    return ops


def in_list_order(refs, names, table):
    """refs ordered as the list names its ops; an error naming every op of the
    list without a reference in table, and every reference the list lacks."""
    missing = [n for n in names if n not in refs]
    unlisted = [n for n in refs if n not in names]
    if missing or unlisted:
        raise RuntimeError(
            f"differential_ref.py: {table} must hold a torch reference for each op of lib/core/ops.def "
            f"of its form; missing: {missing or 'none'}; not in the list: {unlisted or 'none'}")
    return {n: refs[n] for n in names}



def sum_to(g, shape):
    """Sums a broadcast gradient back to shape."""
    lead = g.dim() - len(shape)
    if lead:
        g = g.sum(tuple(range(lead)))
    dims = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    if dims:
        g = g.sum(dims, keepdim=True)
    return g.reshape(shape)


def ref_sign(x):
    """nabla's sign(NaN) is NaN (as NumPy's) and sign(-0) is -0; torch.sign
    gives 0 and +0. The gradient is zero in both."""
    xd = x.detach()
    value = torch.where(xd == 0, xd, torch.where(xd.isnan(), xd, torch.sign(xd)))
    # The value, with torch.sign's (zero) gradient still flowing back to x.
    return torch.where(torch.ones_like(xd, dtype=torch.bool), value, torch.sign(x))


def elementwise_ref(forward, slope):
    """A one-input op whose gradient is g * slope(x), slope built from torch ops
    so that the second order differentiates it too."""

    class Ref(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return forward(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * slope(x)

    return Ref


# nabla's abs has the slope sign(x), so NaN at NaN (torch's is 0).
RefAbs = elementwise_ref(torch.abs, ref_sign)

# nabla's relu multiplies the gradient by its step x > 0, so a NaN input passes
# none and a NaN gradient stays NaN where x <= 0 (torch's selects).
RefRelu = elementwise_ref(torch.relu, lambda x: (x > 0).to(x.dtype))

# rsqrt with the slope -y / 2x, as nabla's: at -0, where y = -inf, that is -inf
# (the limit from above, where rsqrt is defined); torch's -y^3 / 2 gives +inf.
RefRsqrt = elementwise_ref(torch.rsqrt, lambda x: -0.5 * torch.rsqrt(x) / x)

# softplus exact everywhere (torch's switches to x above 20) with the slope
# sigmoid(x), whose own slope is 0 at -inf (logaddexp's is NaN there).
RefSoftplus = elementwise_ref(lambda x: torch.logaddexp(x, torch.zeros_like(x)), torch.sigmoid)


# elu with nabla's slope: exp(x) below 0, 1 from 0 up and at NaN (as torch's
# elementwise slope), exp seeing 0 off the lower side so its second order
# stays finite at +inf.
RefElu = elementwise_ref(torch.nn.functional.elu,
                         lambda x: torch.where(x < 0, torch.exp(torch.where(x < 0, x, torch.zeros_like(x))),
                                               torch.ones_like(x)))

class RefPow(torch.autograd.Function):
    """nabla's pow (TensorFlow's rule): d/db a^b = a^b log a is taken as 0 where
    a <= 0 (torch gives NaN for a < 0, and -inf at 0 for b < 0). d/da is
    b a^(b-1), 0 where b = 0 whatever the incoming gradient, as in torch. The
    backward uses this same pow, so the second order follows the same rule."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.pow(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        zero = torch.zeros((), dtype=a.dtype)
        b_zero = b == 0
        da = torch.where(b_zero, zero, b * RefPow.apply(a, b - 1))
        pos = a > 0
        loga = torch.where(pos, torch.log(torch.where(pos, a, torch.ones_like(a))), zero)
        db = RefPow.apply(a, b) * loga
        return sum_to(torch.where(b_zero, zero, g * da), a.shape), sum_to(g * db, b.shape)


def ref_pow_scalar(x, e):
    """C's pow, as nabla's: torch computes x^0.5 and x^-0.5 as sqrt and rsqrt
    (NaN at -inf, -0 kept), but not with the exponent as a tensor. x^0 keeps
    the scalar form, whose slope is a constant 0."""
    return torch.pow(x, e if e == 0 else torch.tensor(e, dtype=x.dtype))


class RefSelect(torch.autograd.Function):
    """nabla's maximum/minimum: the value is a where a > b (a < b) or a is NaN,
    else b, so a tie of +0 and -0 gives b; the gradient goes to a where
    a > b (a < b), is split in half at a tie (as torch.maximum does), and
    goes to b elsewhere, NaN included."""

    @staticmethod
    def forward(ctx, a, b, is_max):
        ctx.save_for_backward(a, b)
        ctx.is_max = is_max
        pick = (a > b if is_max else a < b) | a.isnan()
        return torch.where(pick, a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        wins = a > b if ctx.is_max else a < b
        tie = a == b
        zero = torch.zeros((), dtype=g.dtype)
        half = g * 0.5
        ga = torch.where(wins, g, torch.where(tie, half, zero))
        gb = torch.where(wins, zero, torch.where(tie, half, g))
        return sum_to(ga, a.shape), sum_to(gb, b.shape), None


def ref_reduce(name, x, axes, keep):
    """nabla's reductions over a set of axes ([] means all). max and min share
    the gradient among ties, as torch's amax/amin do (torch.max picks one)."""
    if x.dim() == 0:
        return ref_reduce(name, x.reshape(1), [0], False)
    dims = sorted({a % x.dim() for a in axes}) if axes else list(range(x.dim()))
    if name == "sum":
        return x.sum(dims, keepdim=keep)
    if name == "mean":
        return x.mean(dims, keepdim=keep)
    if name == "max":
        return x.amax(dims, keepdim=keep)
    if name == "min":
        return x.amin(dims, keepdim=keep)
    if name == "logsumexp":
        return torch.logsumexp(x, dims, keepdim=keep)
    y = x  # prod: torch's takes one dim at a time
    for d in reversed(dims):
        y = y.prod(d, keepdim=True)
    return y if keep else y.reshape([s for i, s in enumerate(x.shape) if i not in dims])


def cumsum_value(x, axis, exclusive, reverse):
    """nabla's cumsum (TensorFlow's): torch.cumsum on x flipped along axis when
    reverse (and the result flipped back), shifted one place along axis with a
    leading 0 when exclusive. A 0-d x is one element."""
    if x.dim() == 0:
        return cumsum_value(x.reshape(1), 0, exclusive, reverse).reshape(())
    axis %= x.dim()
    t = x.flip(axis) if reverse else x
    c = torch.cumsum(t, axis)
    n = t.shape[axis]
    if exclusive and n > 0:
        c = torch.cat([torch.zeros_like(t.narrow(axis, 0, 1)), c.narrow(axis, 0, n - 1)], axis)
    return c.flip(axis) if reverse else c


class RefCumsum(torch.autograd.Function):
    """cumsum_value with nabla's gradient, the running sum of g the other way
    round: the same as torch's for an inclusive sum; for an exclusive one the
    element the shift drops gets a gradient of 0 (where the shifted torch
    expression leaves it unconnected), so that 0 * inf further back is NaN in
    both. The backward applies itself, so the second order follows."""

    @staticmethod
    def forward(ctx, x, axis, exclusive, reverse):
        ctx.args = (axis, exclusive, reverse)
        return cumsum_value(x, axis, exclusive, reverse)

    @staticmethod
    def backward(ctx, g):
        axis, exclusive, reverse = ctx.args
        return RefCumsum.apply(g, axis, exclusive, not reverse), None, None, None


def ref_cast_int(x, dtype):
    """nabla's float-to-integer cast: toward zero, saturating, NaN to 0. Kept
    as float64 values (2^63 - 1 is not a float64)."""
    lo, hi = (-2.0**31, 2.0**31 - 1) if dtype == "i32" else (-2.0**63, 2.0**63)
    x = x.detach()
    return torch.where(x.isnan(), 0.0, x).clamp(lo, hi).trunc() + 0.0  # an integer has no -0


class RefSigmoidCE(torch.autograd.Function):
    """nabla's sigmoid_cross_entropy, max(x,0)(1-z) + max(-x,0) z + log(1 +
    exp(-|x|)), with the gradient (sigmoid(x) - z) g and -x g as torch's; at an
    infinite logit its value is the limit (torch's is NaN at x = -inf)."""

    @staticmethod
    def forward(ctx, x, z):
        ctx.save_for_backward(x, z)
        return torch.relu(x) * (1 - z) + torch.relu(-x) * z + torch.log1p(torch.exp(-x.abs()))

    @staticmethod
    def backward(ctx, g):
        x, z = ctx.saved_tensors
        return (torch.sigmoid(x) - z) * g, -x * g


UNARY = {
    "neg": lambda x: -x,
    "abs": RefAbs.apply,
    "sign": ref_sign,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": RefRsqrt.apply,
    "square": lambda x: x * x,
    "sin": torch.sin,
    "cos": torch.cos,
    "tanh": torch.tanh,
    "erf": torch.erf,
    "sigmoid": torch.sigmoid,
    "relu": RefRelu.apply,
    "gelu": F.gelu,
    "softplus": RefSoftplus.apply,
    "silu": F.silu,
    "elu": RefElu.apply,
}

BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": RefPow.apply,
    "maximum": lambda a, b: RefSelect.apply(a, b, True),
    "minimum": lambda a, b: RefSelect.apply(a, b, False),
}

# nb_<name>(x, alpha)
SCALAR = {
    "leaky_relu": F.leaky_relu,
    "add_scalar": lambda x, c: x + c,
    "mul_scalar": lambda x, c: x * c,
    "pow_scalar": ref_pow_scalar,
}

COMPARE = {
    "equal": torch.eq,
    "not_equal": torch.ne,
    "less": torch.lt,
    "less_equal": torch.le,
    "greater": torch.gt,
    "greater_equal": torch.ge,
}

_LISTED = listed_ops()
UNARY = in_list_order(UNARY, _LISTED["unary"], "UNARY")
SCALAR = in_list_order(SCALAR, _LISTED["scalar"], "SCALAR")
BINARY = in_list_order(BINARY, _LISTED["binary"], "BINARY")
COMPARE = in_list_order(COMPARE, _LISTED["compare"], "COMPARE")

REDUCE = ("sum", "mean", "max", "min", "prod", "logsumexp")


def _cast(x, dtype):
    t = x.t
    if dtype in ("f32", "f64"):
        return t.double()  # the rounding to f32 is the caller's
    if dtype == "bool":
        return t.detach() != 0
    if t.dtype == torch.bool:
        return t.double()
    return ref_cast_int(t.double(), dtype) if x.dtype in ("f32", "f64") else t


def _split(x, axis, pick, n, sized, *sizes):
    d = x.t.shape[axis]
    sizes = list(sizes) if sized else [d // n] * n
    return torch.split(x.t, sizes, dim=axis)[pick]


def _slice(x, begin, size):
    t = x.t
    for i, (b, s) in enumerate(zip(begin, size)):
        t = t.narrow(i, b, t.shape[i] - b if s == -1 else s)
    return t


def _pad(x, before, after, value):
    pads = []
    for b, a in zip(reversed(before), reversed(after)):
        pads += [b, a]
    return F.pad(x.t, pads, value=value)


def _sparse_ce(x, z):
    n = x.t.shape[0]
    return -F.log_softmax(x.t, -1).gather(1, z.t.long().reshape(n, 1)).reshape(n)


OPS = {
    "where": lambda c, a, b: torch.where(c.t, a.t, b.t),
    "sum_all": lambda x: x.t.sum(),
    "mean_all": lambda x: x.t.mean(),
    "cumsum": lambda x, axis, exclusive, reverse: RefCumsum.apply(x.t, axis, bool(exclusive), bool(reverse)),
    "argmax": lambda x, axis, keep: x.t.detach().argmax(axis, keepdim=bool(keep)),
    "argmin": lambda x, axis, keep: x.t.detach().argmin(axis, keepdim=bool(keep)),
    # nabla's products sum from +0, so a zero result is +0 (torch's may be -0).
    "matmul": lambda a, b: torch.matmul(a.t, b.t) + 0.0,
    "softmax": lambda x, axis: F.softmax(x.t, dim=axis),
    "log_softmax": lambda x, axis: F.log_softmax(x.t, dim=axis),
    "softmax_cross_entropy": lambda x, z: -(z.t * F.log_softmax(x.t, -1)).sum(-1),
    "sparse_softmax_cross_entropy": _sparse_ce,
    "sigmoid_cross_entropy": lambda x, z: RefSigmoidCE.apply(x.t, z.t),
    "mean_squared_error": lambda a, b: ((a.t - b.t) ** 2).mean(),
    "reshape": lambda x, shape: x.t.reshape(shape),
    "transpose": lambda x, d0, d1: x.t.transpose(d0, d1),
    "permute": lambda x, perm: x.t.permute(perm),
    "expand_dims": lambda x, axis: x.t.unsqueeze(axis),
    "squeeze": lambda x, axis: x.t.squeeze(axis),
    "slice": _slice,
    "broadcast_to": lambda x, shape: x.t.expand(shape),
    "contiguous": lambda x: x.t.contiguous(),
    "concat": lambda axis, xs: torch.cat([x.t for x in xs], axis),
    "stack": lambda axis, xs: torch.stack([x.t for x in xs], axis),
    "split": _split,
    "gather": lambda x, idx: x.t[idx.t.long()],
    # An index outside [0, depth) gives a row of zeros (TensorFlow's rule;
    # F.one_hot refuses it).
    "one_hot": lambda idx, depth, dtype: (idx.t.long().unsqueeze(-1) == torch.arange(depth)).double(),
    "cast": _cast,
    "pad": _pad,
    "stop_gradient": lambda x: x.t.detach(),
}
for _name, _fn in UNARY.items():
    OPS[_name] = lambda x, _fn=_fn: _fn(x.t)
for _name, _fn in SCALAR.items():
    OPS[_name] = lambda x, a, _fn=_fn: _fn(x.t, a)
for _name, _fn in BINARY.items():
    OPS[_name] = lambda a, b, _fn=_fn: _fn(a.t, b.t)
for _name, _fn in COMPARE.items():
    OPS[_name] = lambda a, b, _fn=_fn: _fn(a.t, b.t)
for _name in REDUCE:
    OPS[_name] = lambda x, keep, axes, _name=_name: ref_reduce(_name, x.t, axes, bool(keep))


def evaluate(name, args):
    """Op name applied to args (runner order); a float result may come back
    in float64 whatever the inputs, the caller converts it."""
    return OPS[name](*args)
