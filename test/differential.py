#!/usr/bin/env python3
"""Differential test of nabla against PyTorch (float64 reference).

Generates seeded random straight-line programs of nabla ops over 1-3 random
inputs (odd sizes, broadcasting, views, ties, exact zeros, and sometimes
infinities and NaN), runs them all in one test/differential_runner process and
computes each again with torch in float64 (test/differential_ref.py). Compares
the values, the gradient of sum(output * W) with respect to every watched
input, and the second-order gradient of sum_k sum(grad_k * V_k), for random
weights W and V.

f32 variables are emulated in the reference by rounding every op's result to
f32 (computing in f64, storing in f32, as nabla's f32 kernels nearly do), so
that overflow and the rounding of stored values agree; such programs get a
looser tolerance; and where the reference moves by more than that when the
rounding is left out or when torch computes in float32 (an ill-conditioned
element), nabla may differ by a multiple of that spread. NaN must
match NaN and an infinity must match exactly.

usage: differential.py RUNNER [--seed S] [--count N] [--program I] [--dump]
                              [--keep-going] [--verbose]
Exits 0 when everything agrees, 1 on a mismatch (printing the seed, the program
and the first differing element), 77 when torch cannot be imported.
"""

import argparse
import math
import os
import random
import struct
import subprocess
import sys
import time
import warnings

# torch warns on import when NumPy is missing; the test does not need NumPy.
warnings.filterwarnings("ignore")
try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means: skip
    print(f"differential: skipped: cannot import torch ({type(e).__name__}: {e})")
    sys.exit(77)

import differential_ref as ref  # noqa: E402 - needs torch

torch.set_num_threads(1)  # tiny tensors: threads only cost

# The list's ops with a scalar, each given its own scalars by g_unary and g_scalar.
SCALAR_OPS = ("leaky_relu", "pow_scalar", "add_scalar", "mul_scalar")
if set(ref.SCALAR) != set(SCALAR_OPS):
    raise RuntimeError(f"differential.py: generators know the scalar ops {SCALAR_OPS}, "
                       f"lib/core/ops.def lists {tuple(ref.SCALAR)}")

INF = math.inf
NAN = math.nan
FLOATS = ("f32", "f64")
MAX_NUMEL = 144  # keeps every tensor small, so programs stay fast
# Relative tolerances, of |reference| + the tensor's largest |reference| + 1.
TOL = {"f64": 1e-9, "f32": 2e-4}
SECOND_ORDER_SLACK = 4  # second-order gradients go through twice the arithmetic
ALT_SLACK = 16  # times the references' own spread, for an ill-conditioned f32 element


def f32(x):
    """x rounded to the nearest float32 (infinite when out of range)."""
    if not math.isfinite(x):
        return x
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(INF, x)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def fmt(x):
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return repr(x)
    return str(x)


def broadcasts(a, b):
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b)))


def random_factorization(rng, shape):
    """A random shape (1 to 4 dims, 0 to 3 for one element) with shape's count."""
    n = numel(shape)
    factors, m, p = [], n, 2
    while m > 1:
        while m % p == 0:
            factors.append(p)
            m //= p
        p += 1
    ndim = rng.randint(1, 4) if n > 1 else rng.randint(0, 3)
    dims = [1] * ndim
    for f in factors:
        dims[rng.randrange(ndim)] *= f
    return tuple(dims)


def flat(t):
    """A tensor's values as a list of floats (autograd's zero tensors too)."""
    t = t.detach()
    if t._is_zerotensor():
        t = torch.zeros(t.shape, dtype=torch.float64)
    return [float(x) for x in t.double().contiguous().reshape(-1).tolist()]


# Views keep values exactly, the sign of a zero included.
VIEWS = ("reshape", "transpose", "permute", "expand_dims", "squeeze", "slice", "broadcast_to",
         "contiguous", "stop_gradient")
# Below this (relative, or absolute near 0) a computed value is as good as its
# rounding in nabla and in torch, which may fall on either side of a boundary.
BOUNDARY_EPS = {"f64": 1e-9, "f32": 1e-5}


def exact(v):
    """Whether v's values are the same bits in nabla and the reference: an
    input, or a view of one."""
    return v.name is None or (v.name in VIEWS and exact(v.args[0]))


def near_boundary(name, args):
    """Whether op name(args) decides something on a computed value that
    rounding could move across the decision: a value near but not at 0 where
    the op has a kink, a pole or a policy at 0 (or a zero whose sign decides
    +-inf), near-ties where it compares, a value near an integer where it
    truncates. Such ops are not generated: the two sides may both be right."""
    def vals(v):
        return v.t.detach().double()

    def tiny(v):
        t = vals(v)
        return bool(((t != 0) & (t.abs() < BOUNDARY_EPS[v.dtype])).any())

    def signed_zero(v):
        return bool((vals(v) == 0).any())

    x = args[0]
    if not isinstance(x, Var) or not x.is_float:
        return False
    if name in ("relu", "leaky_relu", "abs", "sign", "sqrt", "log", "prod") or \
            (name == "cast" and args[1] == "bool"):
        return not exact(x) and tiny(x)
    if name in ("rsqrt", "pow_scalar"):
        return not exact(x) and (tiny(x) or signed_zero(x))
    if name in ("div", "pow"):
        d = args[1] if name == "div" else x
        return not exact(d) and (tiny(d) or signed_zero(d))
    if name in ("maximum", "minimum") or name in ref.COMPARE:
        a, b = vals(x), vals(args[1])
        if exact(x) and exact(args[1]):
            return False
        d = (a - b).abs()
        ok = torch.isfinite(a) & torch.isfinite(b)
        return bool((ok & (d > 0) & (d <= BOUNDARY_EPS[x.dtype] * (a.abs() + b.abs()))).any())
    if name in ("max", "min", "argmax", "argmin"):
        t = vals(x).reshape(-1)
        t = t[torch.isfinite(t)].sort().values
        d = t[1:] - t[:-1]
        return not exact(x) and bool(((d > 0) & (d <= BOUNDARY_EPS[x.dtype] * t[1:].abs())).any())
    if name == "cast" and args[1] in ("i32", "i64"):
        t = vals(x)
        t = t[torch.isfinite(t)]
        d = (t - t.round()).abs()
        return not exact(x) and bool(((d > 0) & (d <= BOUNDARY_EPS[x.dtype] * t.abs().clamp(min=1))).any())
    return False


class Var:
    """A program variable: an input (vals) or an op (name, args), its nabla
    dtype, and its current torch value t."""

    def __init__(self, idx, dtype, name=None, args=None, vals=None, shape=None, watch=False):
        self.idx, self.dtype = idx, dtype
        self.name, self.args = name, args
        self.vals, self.in_shape, self.watch = vals, shape, watch
        self.t = None

    @property
    def shape(self):
        return tuple(self.t.shape)

    @property
    def ndim(self):
        return self.t.dim()

    @property
    def is_float(self):
        return self.dtype in FLOATS

    def compute(self, mode):
        """Sets t: a fresh leaf for an input, else the op on its arguments'
        current values. mode: "emulate" computes f32 variables in float64 and
        rounds them to f32, "f64" does not round, "f32" computes them in
        float32."""
        f32_dtype = torch.float32 if mode == "f32" else torch.float64
        if self.name is None:
            if self.dtype in FLOATS:
                self.leaf = torch.tensor(self.vals, dtype=f32_dtype if self.dtype == "f32" else torch.float64)
                self.leaf = self.leaf.reshape(self.in_shape).requires_grad_(self.watch)
                # Exact on the values; it rounds the gradient to f32.
                self.t = self.leaf.float().double() if mode == "emulate" and self.dtype == "f32" else self.leaf
            else:
                dt = torch.bool if self.dtype == "bool" else torch.int64
                self.t = torch.tensor(self.vals, dtype=torch.float64).to(dt).reshape(self.in_shape)
            return
        t = ref.evaluate(self.name, self.args)
        if self.dtype == "f64":
            t = t.double()
        elif self.dtype == "f32":
            t = t.to(f32_dtype)
            if mode == "emulate":
                t = t.float().double()
        self.t = t


class Rollback(Exception):
    """A generated op that does not fit (too large, not applicable): undone."""


class Program:
    """One random program, evaluated with torch as it is generated."""

    def __init__(self, seed, pid):
        self.rng = rng = random.Random(seed * 1000003 + pid)
        self.pid = pid
        self.vars = []
        self.dtype = "f64" if rng.random() < 0.6 else "f32"
        self.edge = rng.random() < 0.4  # zeros, +-1, ties ...
        self.nonfinite = self.edge and rng.random() < 0.5  # ... and inf, NaN
        self.ties = rng.random() < 0.2  # values from a small set
        self.order = 2 if rng.random() < 0.7 else 1
        self.persistent = rng.random() < 0.3
        self.seeded = rng.random() < 0.5
        self.w = self.v = None
        self.done = False  # no more ops after this one

    @property
    def watched(self):
        return [v for v in self.vars if v.watch]

    @property
    def nops(self):
        return sum(1 for v in self.vars if v.name is not None)

    def uses_f32(self):
        return any(v.dtype == "f32" for v in self.vars)

    # ---- building ----------------------------------------------------------------------

    def values(self, n, kind, dtype):
        rng = self.rng
        out = []
        for _ in range(n):
            if kind == "prob":
                v = rng.random()
            elif kind == "exponent":
                v = rng.choice([-2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 0.5, 1.5]) if rng.random() < 0.5 else rng.gauss(0, 1.5)
            elif self.ties:
                v = rng.choice([-1.0, 0.0, 1.0, 2.0, 0.5])
            else:
                v = rng.gauss(0, 1.5)
            out.append(v)
        if self.edge:
            for i in range(n):
                if rng.random() < 0.25:
                    choices = [0.0, -0.0, 1.0, -1.0, 0.5, -2.0, "tie"]
                    if kind == "prob":
                        choices = [0.0, 1.0, "tie"]
                    elif self.nonfinite:
                        choices += [INF, -INF, NAN]
                    c = rng.choice(choices)
                    out[i] = out[rng.randrange(n)] if c == "tie" else c
        return [f32(v) for v in out] if dtype == "f32" else out

    def input(self, shape, dtype, kind="normal", watch=None, hi=2, lo=0):
        """A new input: floats (watched unless told), integers in [lo, hi), bools."""
        shape = tuple(shape)
        n = numel(shape)
        if dtype in FLOATS:
            vals = self.values(n, kind, dtype)
            watch = True if watch is None else watch
        elif dtype == "bool":
            vals = [float(self.rng.random() < 0.5) for _ in range(n)]
            watch = False
        else:
            if hi <= lo and n > 0:
                raise Rollback  # no valid index into an empty dim
            vals = [float(self.rng.randrange(lo, hi)) for _ in range(n)]
            watch = False
        v = Var(len(self.vars), dtype, vals=vals, shape=shape, watch=watch)
        v.compute("emulate")
        self.vars.append(v)
        return v

    def op(self, name, args, dtype):
        """Appends op name(args) giving dtype; returns its variable."""
        v = Var(len(self.vars), dtype, name=name, args=args)
        try:
            v.compute("emulate")
        except (RuntimeError, IndexError) as e:  # the generator's mistake: not a test
            raise Rollback from e
        if v.t.numel() > MAX_NUMEL or near_boundary(name, args):
            raise Rollback
        self.vars.append(v)
        return v

    def floats(self):
        return [v for v in self.vars if v.is_float]

    def current(self):
        """Mostly the latest float variable, so that ops form chains."""
        fl = self.floats()
        return fl[-1] if self.rng.random() < 0.75 else self.rng.choice(fl)

    def scalar(self, dtype, choices):
        c = self.rng.choice(choices)
        if c == "normal":
            c = round(self.rng.gauss(0, 1.5), 3)
        return f32(c) if dtype == "f32" else c

    def broadcastable_shape(self, shape):
        """A shape that broadcasts with shape."""
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            return shape
        if r < 0.6:
            return tuple(1 if rng.random() < 0.5 else d for d in shape)
        if r < 0.75:
            return tuple(shape[rng.randrange(len(shape) + 1):])
        if r < 0.85 and len(shape) < 4 and numel(shape) * 3 <= MAX_NUMEL:
            return (rng.choice([2, 3]),) + tuple(1 if rng.random() < 0.5 else d for d in shape)
        return ()

    def partner(self, a, kind="normal"):
        """A second float operand of a's dtype that broadcasts with a: an
        earlier variable, a itself, or a new input."""
        rng = self.rng
        r = rng.random()
        if r < 0.35:
            cands = [v for v in self.floats() if v is not a and v.dtype == a.dtype and broadcasts(v.shape, a.shape)]
            if cands:
                return rng.choice(cands)
        if r < 0.45:
            return a
        return self.input(self.broadcastable_shape(a.shape), a.dtype, kind)

    def random_axes(self, ndim):
        """A set of axes (some negative), or [] for all."""
        rng = self.rng
        if ndim == 0 or rng.random() < 0.25:
            return []
        axes = rng.sample(range(ndim), rng.randint(1, ndim))
        return [a - ndim if rng.random() < 0.3 else a for a in axes]

    def random_shape(self):
        rng = self.rng
        ndim = rng.choices([0, 1, 2, 3], weights=[1, 3, 4, 2])[0]
        while True:
            shape = [rng.choices([1, 2, 3, 4, 5, 7], weights=[3, 2, 3, 1, 2, 1])[0] for _ in range(ndim)]
            if ndim and rng.random() < 0.04:  # now and then an empty tensor
                shape[rng.randrange(ndim)] = 0
            if numel(shape) <= 60:
                return tuple(shape)

    # ---- op generators: each adds one or a few ops, or raises Rollback ---------------

    def g_unary(self, x):
        rng = self.rng
        name = rng.choice(list(ref.UNARY) + ["leaky_relu", "pow_scalar"])
        if name in ("log", "sqrt", "rsqrt") and rng.random() < 0.6:
            x = self.op("abs", [x], x.dtype)  # mostly in the domain
        if name == "leaky_relu":
            return self.op(name, [x, self.scalar(x.dtype, [0.01, 0.2, 0.0, 1.5, -0.5])], x.dtype)
        if name == "pow_scalar":
            e = self.scalar(x.dtype, [2.0, 3.0, 0.5, -1.0, 0.0, 1.0, -0.5, 1.5, -2.0, 2.5])
            if e != int(e) and rng.random() < 0.6:
                x = self.op("abs", [x], x.dtype)
            return self.op(name, [x, e], x.dtype)
        return self.op(name, [x], x.dtype)

    def g_scalar(self, x):
        choices = ["normal", "normal", 0.0, 1.0, -1.0, 2.0, 0.5] + ([INF, -INF] if self.nonfinite else [])
        return self.op(self.rng.choice(["add_scalar", "mul_scalar"]), [x, self.scalar(x.dtype, choices)], x.dtype)

    def g_binary(self, x):
        rng = self.rng
        name = rng.choice(list(ref.BINARY))
        if name == "pow":
            if rng.random() < 0.6:
                x = self.op("abs", [x], x.dtype)
            return self.op(name, [x, self.partner(x, "exponent")], x.dtype)
        a, b = x, self.partner(x)
        if rng.random() < 0.5:
            a, b = b, a
        return self.op(name, [a, b], x.dtype)

    def g_where(self, x):
        rng = self.rng
        if rng.random() < 0.8:
            c = self.op(rng.choice(list(ref.COMPARE)), [x, self.partner(x)], "bool")
        else:
            c = self.input(self.broadcastable_shape(x.shape), "bool")
        y = self.partner(x)
        return self.op("where", [c, x, y] if rng.random() < 0.5 else [c, y, x], x.dtype)

    def g_reduce(self, x):
        rng = self.rng
        name = rng.choice(ref.REDUCE + ("sum_all", "mean_all"))
        if name in ("sum_all", "mean_all"):
            return self.op(name, [x], x.dtype)
        if name == "prod" and (self.nonfinite or not torch.isfinite(x.t).all()):
            # Left out where infinities or NaN may meet it: prod's gradient at
            # an infinite or NaN input is not exact in nabla (prod / inf is NaN;
            # the zero masks drop a NaN), where torch's exclusive cumulative
            # products are (nabla has no cumprod); and with an infinite gradient
            # from further on, its second order is inf * 0 = NaN at a zero where
            # torch's formulas happen to give 0.
            raise Rollback
        if name == "prod":
            t = x.t.detach().double().abs()
            if t[t > 0].log().sum() > (80 if x.dtype == "f32" else 700):
                # Left out: the product of the nonzero inputs overflows. nabla's
                # gradient builds on it; the result is 0 beside a zero, but a
                # second order through it meets inf * 0 = NaN (torch's f64
                # exclusive products do not overflow).
                raise Rollback
        return self.op(name, [x, int(rng.random() < 0.5), self.random_axes(x.ndim)], x.dtype)

    def g_scan(self, x):
        rng = self.rng
        nd = max(x.ndim, 1)  # a 0-d x is one element along axis 0 or -1
        return self.op("cumsum", [x, rng.randrange(-nd, nd), int(rng.random() < 0.5), int(rng.random() < 0.5)],
                       x.dtype)

    def g_arg(self, x):
        if x.ndim == 0:
            raise Rollback
        rng = self.rng
        keep = int(rng.random() < 0.5)
        i = self.op(rng.choice(["argmax", "argmin"]), [x, rng.randrange(-x.ndim, x.ndim), keep], "i64")
        # On as a float constant; with keepdims it broadcasts back onto x.
        c = self.op("cast", [i, x.dtype], x.dtype)
        return self.op("mul", [x, c], x.dtype) if keep and rng.random() < 0.7 else c

    def g_matmul(self, a):
        rng = self.rng
        dt = a.dtype
        if a.ndim == 0:
            raise Rollback
        K = a.shape[-1]
        r = rng.random()
        if a.ndim == 1:
            bshape = rng.choice([(K,), (K, rng.choice([1, 2, 3])), (2, K, 3)])
        elif r < 0.3:
            bshape = (K,)
        elif r < 0.75:
            bshape = (K, rng.choice([1, 2, 3, 5]))
        else:  # batched, the batch dims broadcasting
            batch = a.shape[:-2]
            bb = tuple(1 if rng.random() < 0.3 else d for d in batch) if batch else (rng.choice([2, 3]),)
            bshape = bb + (K, rng.choice([1, 2, 3]))
        if rng.random() < 0.3 and len(bshape) >= 2:  # a transposed view, used in place
            bt = self.input(bshape[:-2] + (bshape[-1], bshape[-2]), dt)
            b = self.op("transpose", [bt, -1, -2], dt)
        elif rng.random() < 0.15 and a.ndim >= 2:
            b = self.op("transpose", [a, -1, -2], dt)
        else:
            b = self.input(bshape, dt)
        if rng.random() < 0.3 and a.ndim >= 2 and b.ndim >= 2:  # (b^T a^T) for good measure
            a, b = self.op("transpose", [b, -1, -2], dt), self.op("transpose", [a, -1, -2], dt)
        return self.op("matmul", [a, b], dt)

    def g_big_matmul(self, x):
        """A product past the direct loop of the built-in gemm (M*N*K > 512):
        its packed, register-tiled path, edge tiles and column-major output."""
        rng = self.rng
        dt = x.dtype
        M, K, N = rng.randint(8, 12), rng.randint(8, 12), rng.randint(8, 12)
        a = x if x.ndim == 2 and x.shape[0] * x.shape[1] >= 64 else self.input((M, K), dt)
        K = a.shape[1]
        if rng.random() < 0.5:
            b = self.input((K, N), dt)
        else:
            b = self.op("transpose", [self.input((N, K), dt), 0, 1], dt)
        if rng.random() < 0.3:  # (b^T a^T)^T: a column-major result
            return self.op("transpose", [self.op("matmul", [self.op("transpose", [b, 0, 1], dt),
                                                            self.op("transpose", [a, 0, 1], dt)], dt), 0, 1], dt)
        return self.op("matmul", [a, b], dt)

    def g_softmax(self, x):
        if x.ndim == 0:
            raise Rollback
        return self.op(self.rng.choice(["softmax", "log_softmax"]), [x, self.rng.randrange(-x.ndim, x.ndim)], x.dtype)

    def as_2d(self, x):
        if x.ndim == 2:
            return x
        if x.ndim == 0:
            raise Rollback
        return self.op("reshape", [x, [-1, x.shape[-1]]], x.dtype)

    def g_loss(self, x):
        rng = self.rng
        dt = x.dtype
        name = rng.choice(["softmax_cross_entropy", "sparse_softmax_cross_entropy",
                           "sigmoid_cross_entropy", "mean_squared_error"])
        if name == "softmax_cross_entropy":
            x = self.as_2d(x)
            return self.op(name, [x, self.input(x.shape, dt, "prob", watch=rng.random() < 0.5)], dt)
        if name == "sparse_softmax_cross_entropy":
            x = self.as_2d(x)
            return self.op(name, [x, self.input(x.shape[:1], rng.choice(["i32", "i64"]), hi=x.shape[1])], dt)
        if name == "sigmoid_cross_entropy":
            return self.op(name, [x, self.input(x.shape, dt, "prob", watch=rng.random() < 0.5)], dt)
        cands = [v for v in self.floats() if v is not x and v.dtype == dt and v.shape == x.shape]
        z = rng.choice(cands) if cands and rng.random() < 0.4 else self.input(x.shape, dt)
        return self.op(name, [x, z] if rng.random() < 0.5 else [z, x], dt)

    def g_view(self, x):
        rng = self.rng
        dt, nd = x.dtype, x.ndim
        name = rng.choice(["reshape", "transpose", "permute", "expand_dims", "squeeze", "slice",
                           "broadcast_to", "contiguous"])
        if name == "reshape":
            shape = list(random_factorization(rng, x.shape))
            if shape and rng.random() < 0.3:
                shape[rng.randrange(len(shape))] = -1
            return self.op(name, [x, shape], dt)
        if name == "transpose":
            if nd < 1:
                raise Rollback
            return self.op(name, [x, rng.randrange(-nd, nd), rng.randrange(-nd, nd)], dt)
        if name == "permute":
            perm = list(range(nd))
            rng.shuffle(perm)
            return self.op(name, [x, perm], dt)
        if name == "expand_dims":
            return self.op(name, [x, rng.randrange(-nd - 1, nd + 1)], dt)
        if name == "squeeze":
            ones = [i for i in range(nd) if x.shape[i] == 1]
            if not ones:
                raise Rollback
            axis = rng.choice(ones)
            return self.op(name, [x, axis - nd if rng.random() < 0.4 else axis], dt)
        if name == "slice":
            if nd == 0:
                raise Rollback
            begin = [rng.randrange(d) if d else 0 for d in x.shape]
            size = [-1 if rng.random() < 0.3 else rng.randint(min(d, 1), d - b) for b, d in zip(begin, x.shape)]
            return self.op(name, [x, begin, size], dt)
        if name == "broadcast_to":
            lead = tuple(rng.choice([2, 3]) for _ in range(rng.randint(0, max(0, min(2, 4 - nd)))))
            shape = lead + tuple(rng.choice([2, 3]) if d == 1 and rng.random() < 0.6 else d for d in x.shape)
            return self.op(name, [x, list(shape)], dt)
        return self.op("contiguous", [x], dt)

    def g_join(self, x):
        rng = self.rng
        dt, nd = x.dtype, x.ndim
        name = rng.choice(["concat", "stack", "split"])
        if name == "split":
            if nd == 0:
                raise Rollback
            axis = rng.randrange(-nd, nd)
            d = x.shape[axis]
            if d < 2:
                raise Rollback
            if rng.random() < 0.5:  # equal pieces
                n = rng.choice([k for k in range(2, d + 1) if d % k == 0])
                return self.op(name, [x, axis, rng.randrange(n), n, 0], dt)
            n = rng.randint(2, min(d, 4))
            cuts = sorted(rng.sample(range(1, d), n - 1))
            sizes = [b - a for a, b in zip([0] + cuts, cuts + [d])]
            if rng.random() < 0.2:  # an empty piece
                sizes.insert(rng.randrange(n + 1), 0)
                n += 1
            return self.op(name, [x, axis, rng.randrange(n), n, 1] + sizes, dt)
        if name == "stack":
            parts = [x, x if rng.random() < 0.3 else self.input(x.shape, dt)]
            if rng.random() < 0.3:
                parts.append(x)
            return self.op(name, [rng.randrange(-nd - 1, nd + 1), parts], dt)
        if nd == 0:
            raise Rollback
        axis = rng.randrange(-nd, nd)
        parts = [x]
        for _ in range(rng.randint(1, 2)):
            shape = list(x.shape)
            shape[axis] = rng.choice([0, 1, 2, 3])
            parts.append(x if rng.random() < 0.3 else self.input(shape, dt))
        rng.shuffle(parts)
        return self.op(name, [axis, parts], dt)

    def g_index(self, x):
        rng = self.rng
        dt = x.dtype
        if x.ndim == 0:
            raise Rollback
        if rng.random() < 0.5:  # rows picked, repeats included
            ishape = tuple(rng.choice([1, 2, 3, 4]) for _ in range(rng.choice([0, 1, 1, 2])))
            idx = self.input(ishape, rng.choice(["i32", "i64"]), hi=x.shape[0])
            return self.op("gather", [x, idx], dt)
        # one_hot over the last dim, masking x
        if x.shape[-1] == 0:
            raise Rollback  # one_hot's depth is at least 1
        depth = x.shape[-1]
        outside = rng.random() < 0.2  # indices out of range give rows of zeros
        idx = self.input(x.shape[:-1], rng.choice(["i32", "i64"]), lo=-outside, hi=depth + 2 * outside)
        if rng.random() < 0.3:  # another dtype, then cast
            odt = rng.choice(["i32", "i64", "bool"])
            oh = self.op("one_hot", [idx, depth, odt], odt)
            oh = self.op("cast", [oh, dt], dt)
        else:
            oh = self.op("one_hot", [idx, depth, dt], dt)
        return self.op("mul", [x, oh], dt)

    def g_cast(self, x):
        rng = self.rng
        r = rng.random()
        if r < 0.6:  # f32 <-> f64, differentiable
            return self.op("cast", [x, "f64" if x.dtype == "f32" else "f32"], "f64" if x.dtype == "f32" else "f32")
        if r < 0.8:  # to bool, as a condition
            b = self.op("cast", [x, "bool"], "bool")
            return self.op("where", [b, x, self.partner(x)], x.dtype)
        it = rng.choice(["i32", "i64"])  # to an integer and back: a constant
        y = self.op("cast", [self.op("cast", [x, it], it), x.dtype], x.dtype)
        t = x.t.detach()
        if not (t.isfinite() & (t.abs() < 2.0**31)).all():
            # Saturated (or NaN made 0): checked as the output, since sums of
            # such huge values only test their own cancellation.
            self.done = True
        return y

    def g_pad(self, x):
        rng = self.rng
        if x.ndim == 0:
            raise Rollback
        before = [rng.randint(0, 2) for _ in range(x.ndim)]
        after = [rng.randint(0, 2) for _ in range(x.ndim)]
        value = self.scalar(x.dtype, [0.0, 0.0, 1.5, -2.0] + ([INF, NAN] if self.nonfinite else []))
        return self.op("pad", [x, before, after, value], x.dtype)

    def g_stop(self, x):
        return self.op("stop_gradient", [x], x.dtype)

    GENERATORS = [
        ("g_unary", 6), ("g_scalar", 2), ("g_binary", 6), ("g_where", 2), ("g_reduce", 4),
        ("g_scan", 1.5), ("g_arg", 1), ("g_matmul", 3), ("g_big_matmul", 0.5), ("g_softmax", 2), ("g_loss", 2),
        ("g_view", 4), ("g_join", 2), ("g_index", 2), ("g_cast", 2), ("g_pad", 1), ("g_stop", 0.3),
    ]

    def generate(self):
        rng = self.rng
        self.input(self.random_shape(), self.dtype)
        names = [g for g, _ in self.GENERATORS]
        weights = [w for _, w in self.GENERATORS]
        for _ in range(rng.randint(1, 5)):
            if self.done:
                break
            for _attempt in range(20):
                n = len(self.vars)
                try:
                    getattr(self, rng.choices(names, weights)[0])(self.current())
                    break
                except Rollback:
                    del self.vars[n:]
        self.weights()
        return self

    def weights(self):
        """W for the output and V for each watched input's gradient."""
        rng = self.rng
        out = self.vars[-1]
        if not out.is_float:
            return
        self.w = [rng.choice([1.0, -1.0, 0.5, 2.0]) if rng.random() < 0.3 else round(rng.gauss(0, 1), 4)
                  for _ in range(out.t.numel())]
        if out.dtype == "f32":
            self.w = [f32(x) for x in self.w]
        self.v = []
        for src in self.watched:
            vals = [round(rng.gauss(0, 1), 4) for _ in range(src.t.numel())]
            self.v.append([f32(x) for x in vals] if src.dtype == "f32" else vals)

    # ---- text --------------------------------------------------------------------------

    def runner_text(self):
        lines = [f"P {self.pid} {self.order} {int(self.persistent)} {int(self.seeded)}"]
        for v in self.vars:
            if v.name is None:
                dims = "".join(f" {d}" for d in v.in_shape)
                lines.append(f"I {v.dtype} {int(v.watch)} {len(v.in_shape)}{dims} " + " ".join(fmt(x) for x in v.vals))
                continue
            toks = []
            for a in v.args:
                if isinstance(a, list):
                    toks.append(str(len(a)))
                    toks += [str(x.idx) if isinstance(x, Var) else fmt(x) for x in a]
                else:
                    toks.append(str(a.idx) if isinstance(a, Var) else fmt(a))
            lines.append(f"O {v.name} " + " ".join(toks))
        if self.w is not None:
            lines.append(f"W {len(self.w)} " + " ".join(fmt(x) for x in self.w))
            for k, vk in enumerate(self.v):
                lines.append(f"V {k} {len(vk)} " + " ".join(fmt(x) for x in vk))
        lines.append("E")
        return "\n".join(lines) + "\n"

    def describe(self):
        def show(a):
            if isinstance(a, Var):
                return f"v{a.idx}"
            if isinstance(a, list):
                return "[" + ", ".join(show(x) for x in a) + "]"
            return fmt(a)

        lines = [f"program {self.pid}: order {self.order}, {'persistent' if self.persistent else 'one-shot'} "
                 f"inner tape, {'seeded' if self.seeded else 'sum(out * W)'} target"]
        for v in self.vars:
            if v.name is None:
                vals = ", ".join(fmt(x) for x in v.vals[:12]) + (", ..." if len(v.vals) > 12 else "")
                kind = "watched" if v.watch else "constant"
                lines.append(f"  v{v.idx} = input({v.dtype}, {list(v.in_shape)}, {kind}) [{vals}]")
            else:
                lines.append(f"  v{v.idx} = {v.name}({', '.join(show(a) for a in v.args)})  -> "
                             f"{v.dtype} {list(v.shape)}")
        return "\n".join(lines)

    # ---- the reference -----------------------------------------------------------------

    def reference(self, mode="emulate"):
        """(value, first-order gradients, second-order gradients or None), all
        recomputed with torch (f32 variables as Var.compute's mode says)."""
        for v in self.vars:
            v.compute(mode)
        y = self.vars[-1].t
        if self.w is None:
            return y, None, None
        srcs = [v.leaf for v in self.watched]
        zeros = [torch.zeros_like(s) for s in srcs]
        if not srcs or not y.requires_grad:
            return y, zeros, (zeros if self.order >= 2 else None)
        w = torch.tensor(self.w, dtype=torch.float64).reshape(y.shape)
        g = torch.autograd.grad((y * w).sum(), srcs, create_graph=self.order >= 2, allow_unused=True)
        g = [z if gi is None else gi for gi, z in zip(g, zeros)]
        if self.order < 2:
            return y, g, None
        s = sum(((gi * torch.tensor(vk, dtype=torch.float64).reshape(gi.shape)).sum() for gi, vk in zip(g, self.v)),
                torch.zeros((), dtype=torch.float64))
        if not s.requires_grad:
            return y, g, zeros
        h = torch.autograd.grad(s, srcs, allow_unused=True)
        return y, g, [z if hi is None else hi for hi, z in zip(h, zeros)]


# ---- comparison ----------------------------------------------------------------------


def parse_runner(out):
    """{program id: record} from the runner's output."""
    recs, cur = {}, None
    for line in out.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "R":
            cur = recs[int(rest)] = {"G": {}, "H": {}, "X": [], "L": None, "V": None}
        elif cur is None:
            continue
        elif tag == "V":
            f = rest.split()
            nd = int(f[1])
            cur["V"] = (f[0], tuple(int(x) for x in f[2:2 + nd]), [float(x) for x in f[3 + nd:]])
        elif tag in ("G", "H"):
            f = rest.split()
            cur[tag][int(f[0])] = [float(x) for x in f[2:]]
        elif tag == "X":
            cur["X"].append(rest)
        elif tag == "L":
            cur["L"] = int(rest)
    return recs


def agree(a, b, tol, scale, lenient=False):
    """Whether a matches reference b: NaN with NaN, an infinity exactly, else
    within tol of |b| + scale + 1. lenient: any two non-finite numbers agree,
    and so does a finite a with a non-finite b (not a NaN where b is finite)."""
    if not math.isfinite(a) or not math.isfinite(b):
        if lenient and not math.isfinite(b):
            return True
        return (math.isnan(a) and math.isnan(b)) or a == b
    return abs(a - b) <= tol * (abs(b) + scale + 1.0)


def first_difference(got, want, tol, alts=(), lenient=False, stats=None):
    """(index, got, want) of the first element that differs, or None. alts:
    other references of an f32 program (without rounding, in float32); an
    element where they spread is ill-conditioned, and nabla gets ALT_SLACK
    times that spread on top of the tolerance (or is not compared, where they
    disagree on being finite)."""
    finite = [abs(r) for r in want if math.isfinite(r)]
    scale = max(finite, default=0.0)
    for i, (a, b) in enumerate(zip(got, want)):
        if agree(a, b, tol, scale, lenient):
            continue
        spread = max((abs(alt[i] - b) for alt in alts), default=0.0)
        if any(not agree(alt[i], b, tol, scale) and not (math.isfinite(alt[i]) and math.isfinite(b))
               for alt in alts):  # finite in one reference, not in another
            stats["ill"] += 1
            continue
        if math.isfinite(a) and math.isfinite(b) and abs(a - b) <= tol * (abs(b) + scale + 1.0) + ALT_SLACK * spread:
            stats["ill"] += 1
            continue
        return i, a, b
    return None


def check(prog, rec, stats):
    """None when nabla agrees with the reference, else what differs."""
    if rec is None:
        return "the runner printed nothing for this program"
    if rec["X"]:
        return "nabla reported an error: " + " | ".join(rec["X"])
    if rec["L"]:
        return f"nabla leaked {rec['L']} tensors"
    f32_used = prog.uses_f32()
    alts = [prog.reference("f64"), prog.reference("f32")] if f32_used else []
    y, g, h = prog.reference()
    out = prog.vars[-1]
    tol = TOL["f32"] if f32_used else TOL["f64"]
    # Once a value or a first-order gradient is infinite or NaN, a second-order
    # element where torch's is not finite is not compared: nabla differentiates
    # each backward formula by the product rule, where inf - inf is NaN, and
    # torch's hand-written double backward formulas take other paths through
    # the infinities. A NaN from nabla where torch's is finite still fails.
    tainted = any(not math.isfinite(x) for v in prog.vars if v.is_float for x in flat(v.t))
    tainted = tainted or any(not math.isfinite(x) for gk in (g or []) for x in flat(gk))
    stats["tainted"] += tainted and h is not None
    dt, shape, vals = rec["V"]
    if dt != out.dtype or shape != tuple(y.shape):
        return f"value: nabla gives {dt} {list(shape)}, expected {out.dtype} {list(y.shape)}"
    want = flat(y)
    stats["values"] += len(want)
    d = first_difference(vals, want, tol if out.is_float else 0.0, [flat(a[0]) for a in alts], stats=stats)
    if d:
        return f"value element {d[0]}: nabla {d[1]!r}, torch {d[2]!r}"
    for tag, grads, what, k2 in (("G", g, "gradient", 1), ("H", h, "second-order gradient", 2)):
        for k, gk in enumerate(grads or []):
            got, want = rec[tag].get(k), flat(gk)
            name = f"{what} of v{prog.watched[k].idx}"
            if got is None or len(got) != len(want):
                return f"{name}: nabla printed {None if got is None else len(got)} values, expected {len(want)}"
            stats["grads" if k2 == 1 else "grads2"] += len(want)
            others = [flat(a[k2][k]) for a in alts]
            d = first_difference(got, want, tol * (SECOND_ORDER_SLACK if k2 == 2 else 1), others,
                                 lenient=k2 == 2 and tainted, stats=stats)
            if d:
                return f"{name}, element {d[0]}: nabla {d[1]!r}, torch {d[2]!r}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runner")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("NB_DIFF_SEED", "20240601")))
    ap.add_argument("--count", type=int, default=int(os.environ.get("NB_DIFF_COUNT", "1500")))
    ap.add_argument("--program", type=int, default=None, help="only this program")
    ap.add_argument("--dump", action="store_true", help="print the runner's input and exit")
    ap.add_argument("--keep-going", action="store_true", help="report every mismatch")
    ap.add_argument("--verbose", action="store_true", help="print every program")
    args = ap.parse_args()

    start = time.time()
    ids = [args.program] if args.program is not None else range(args.count)
    progs = [Program(args.seed, i).generate() for i in ids]
    text = "".join(p.runner_text() for p in progs)
    if args.dump:
        sys.stdout.write(text)
        return 0
    t_gen = time.time()
    run = subprocess.run([args.runner], input=text, capture_output=True, text=True, timeout=240)
    if run.returncode == 77:  # the device asked for (NB_DIFF_DEVICE) is not there
        print(f"differential: {run.stderr.strip()}")
        return 77
    if run.returncode != 0 or "runtime error:" in run.stderr or "Sanitizer" in run.stderr:
        print(f"differential: the runner exited with {run.returncode}\n{run.stderr[-4000:]}")
        return 1
    if run.stderr:
        print(run.stderr[-4000:], end="")
    recs = parse_runner(run.stdout)
    t_run = time.time()

    stats = {"values": 0, "grads": 0, "grads2": 0, "tainted": 0, "ill": 0}
    failures = 0
    for p in progs:
        why = check(p, recs.get(p.pid), stats)
        if args.verbose or why:
            print(p.describe())
        if why:
            failures += 1
            print(f"MISMATCH (seed {args.seed}, program {p.pid}; rerun with --seed {args.seed} "
                  f"--program {p.pid} [--dump]): {why}")
            if not args.keep_going:
                break
    print(f"differential: seed {args.seed}: {len(progs)} programs, {sum(p.nops for p in progs)} ops, "
          f"{sum(p.order == 2 for p in progs)} with second order; compared {stats['values']} values, "
          f"{stats['grads']} first-order and {stats['grads2']} second-order gradient elements "
          f"({stats['tainted']} second-order programs with non-finite values, {stats['ill']} "
          f"ill-conditioned f32 elements skipped); {failures} mismatching program(s); "
          f"{t_gen - start:.1f} s generating, {t_run - t_gen:.1f} s in nabla, "
          f"{time.time() - t_run:.1f} s comparing")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
