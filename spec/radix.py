"""Hand-linearised token counts: every boundary as mixed-radix digits.

z3's integer division with symbolic divisors (and bit-vectors) time out or
vary wildly with the solver seed. This module avoids both. A geometry is two
symbolic radices: ``S = m * u`` (``m >= 1`` blocks of ``u`` tokens per
scheduler block). A token count ``x`` is the triple of digits ``(n, j, s)``::

    x = n*S + j*u + s        0 <= j < m,  0 <= s < u,  n any integer

Every operation the boundary rules need is linear in the digits:

* ``floor_to(x, S)`` is ``(n, 0, 0)``; ``floor_to(x, u)`` is ``(n, j, 0)``;
* adding or removing a token or a block is a digit update with a carry
  (an ``If``), e.g. ``x - 1`` borrows from ``s``, then ``j``, then ``n``;
* ``<``, ``==``, ``min``, ``max`` compare digits lexicographically.

``S`` and ``u`` only ever appear as digit bounds (``j < m``, ``s < u``), so no
product of two unknowns is formed: the queries are linear integer arithmetic
however the geometry varies, with no upper bounds needed. The one exception
is divisibility by a symbolic multiple of ``S`` (a chunk budget c*S):
``n = q*c + r``, used only by the chunked-prefill properties.

The digits of a negative count are normalised the same way (``n < 0``), so
``floor_to`` agrees with Python's ``//`` for every integer, as
``reference.boundaries.floor_to`` does.

Digits that are known numbers stay Python ints (folded here, not in z3), so a
concrete geometry builds small formulas; each new symbolic digit is named by
a fresh variable with a defining equation (``Space.side``), so formulas stay
linear in size, and identical operations are built once (memoised).
"""

from __future__ import annotations

import itertools

import z3

Digit = "int | z3.ArithRef"


def _num(e):
    """A Python int for ints and z3 numerals, else the z3 expression."""
    if isinstance(e, int):
        return e
    if isinstance(e, z3.IntNumRef):
        return e.as_long()
    return e


def _key(e):
    return ("i", e) if isinstance(e, int) else ("z", e.get_id())


# Building terms through z3's C API directly: the Python operators coerce
# and type-check every operand, which made building cost more than solving.
_CTX = z3.main_ctx()
_INTS: dict[int, z3.ArithRef] = {}


def fresh_context() -> None:
    """Start a new z3 main context (and drop the numeral cache) so that the
    next query is built from scratch: z3 numbers its terms in creation order,
    and that order steers the solver's search, so without this a query's
    running time (and, at the timeout, its verdict) would depend on which
    queries the same process built before it. ``spec.catalogue.run_row``
    rebuilds every nonlinear row in a fresh context (linear rows take
    milliseconds whatever the order; a context costs about 7 ms). Terms of
    an earlier context must not be mixed into the new one."""
    global _CTX
    z3.z3._main_ctx = z3.Context()
    _CTX = z3.main_ctx()
    _INTS.clear()


def _ast(x):
    if isinstance(x, int):
        v = _INTS.get(x)
        if v is None:
            v = _INTS[x] = z3.IntVal(x)
        return v.as_ast()
    return x.as_ast()


def _arr(xs):
    arr = (z3.Ast * len(xs))()
    for i, x in enumerate(xs):
        arr[i] = _ast(x)
    return arr


def _int_expr(a) -> z3.ArithRef:
    return z3.ArithRef(a, _CTX)


def _bool_expr(a) -> z3.BoolRef:
    return z3.BoolRef(a, _CTX)


def add(a, b):
    a, b = _num(a), _num(b)
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(b, int) and b == 0:
        return a
    if isinstance(a, int) and a == 0:
        return b
    return _int_expr(z3.Z3_mk_add(_CTX.ref(), 2, _arr((a, b))))


def sub(a, b):
    a, b = _num(a), _num(b)
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    if isinstance(b, int) and b == 0:
        return a
    return _int_expr(z3.Z3_mk_sub(_CTX.ref(), 2, _arr((a, b))))


def lt(a, b):
    a, b = _num(a), _num(b)
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    return _bool_expr(z3.Z3_mk_lt(_CTX.ref(), _ast(a), _ast(b)))


def eq(a, b):
    a, b = _num(a), _num(b)
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if not isinstance(a, int) and not isinstance(b, int) and a.get_id() == b.get_id():
        return True
    return _bool_expr(z3.Z3_mk_eq(_CTX.ref(), _ast(a), _ast(b)))


def _fold(cs, unit: bool, mk):
    """A conjunction (``unit`` True, ``mk`` Z3_mk_and) or disjunction
    (``unit`` False, Z3_mk_or) of ``cs``, folding Python booleans: ``unit``
    terms are dropped, the other boolean decides at once, no term left gives
    ``unit`` and one term is itself."""
    out = []
    for c in cs:
        if c is unit:
            continue
        if c is (not unit):
            return not unit
        out.append(c)
    if not out:
        return unit
    return out[0] if len(out) == 1 else _bool_expr(mk(_CTX.ref(), len(out), _arr(out)))


def AND(*cs):
    return _fold(cs, True, z3.Z3_mk_and)


def OR(*cs):
    return _fold(cs, False, z3.Z3_mk_or)


def NOT(c):
    if isinstance(c, bool):
        return not c
    return _bool_expr(z3.Z3_mk_not(_CTX.ref(), c.as_ast()))


def to_z3(c) -> z3.BoolRef:
    """A folded condition (Python bool or z3 Bool) as a z3 Bool."""
    return z3.BoolVal(c) if isinstance(c, bool) else c


def IF(c, a, b):
    if c is True:
        return a
    if c is False:
        return b
    a, b = _num(a), _num(b)
    if isinstance(a, int) and isinstance(b, int) and a == b:
        return a
    if not isinstance(a, int) and not isinstance(b, int) and a.get_id() == b.get_id():
        return a
    return _int_expr(z3.Z3_mk_ite(_CTX.ref(), c.as_ast(), _ast(a), _ast(b)))


class Space:
    """Digit arithmetic over one geometry ``S = m*u``; collects the side
    constraints that name intermediate digits.

    ``m`` and ``u`` are z3 integers (symbolic geometry) or Python ints
    (a concrete geometry; then every query is plain linear arithmetic over N)."""

    _ids = itertools.count()

    def __init__(self, m, u, tag: str = ""):
        self.m = _num(m)
        self.u = _num(u)
        self.side: list[z3.BoolRef] = []
        self.tag = tag or f"g{next(Space._ids)}"
        self._k = 0
        self._memo: dict = {}
        self.zero = Count(self, 0, 0, 0)
        #: Set once a divisibility by a symbolic multiple of S is built (the
        #: only product of two unknowns): the query is then nonlinear.
        self.nonlinear = False

    # -- naming ----------------------------------------------------------
    def fresh(self, name: str) -> z3.ArithRef:
        self._k += 1
        return z3.Int(f"{self.tag}.{name}{self._k}")

    def let(self, e, name: str = "d"):
        """Name an expression: numbers and variables pass through."""
        e = _num(e)
        if isinstance(e, int) or z3.is_const(e):
            return e
        v = self.fresh(name)
        self.side.append(_bool_expr(z3.Z3_mk_eq(_CTX.ref(), v.as_ast(), e.as_ast())))
        return v

    def count(self, name: str) -> Count:
        """The symbolic token count called ``name`` (normalised digits; the
        same name gives the same count)."""

        def build():
            n, j, s = (z3.Int(f"{name}.{d}") for d in ("n", "j", "s"))
            if isinstance(self.m, int) and self.m == 1:
                j = 0
            else:
                self.side += [0 <= j, j < self.m]
            if isinstance(self.u, int) and self.u == 1:
                s = 0
            else:
                self.side += [0 <= s, s < self.u]
            return Count(self, n, j, s)

        return self.memo(("count", name), build)

    def tokens(self, k: int) -> Count:
        """The constant k tokens (built by +1/-1 steps, so the digits are
        right for every u and m)."""
        return self.zero + k

    def memo(self, key, build):
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def ite(self, c, a: Count, b: Count) -> Count:
        if c is True:
            return a
        if c is False:
            return b
        if not isinstance(c, bool) and z3.is_true(c):
            return a
        if not isinstance(c, bool) and z3.is_false(c):
            return b
        return Count(
            self, self.let(IF(c, a.n, b.n), "n"), self.let(IF(c, a.j, b.j), "j"), self.let(IF(c, a.s, b.s), "s")
        )

    def min(self, a: Count, b: Count) -> Count:
        return self.memo(("min", a.key, b.key), lambda: self.ite(a <= b, a, b))

    def max(self, a: Count, b: Count) -> Count:
        return self.memo(("max", a.key, b.key), lambda: self.ite(a >= b, a, b))

    def value(self, x: Count, model: z3.ModelRef) -> int:
        """The token count of ``x`` in a model."""

        def ev(e):
            e = _num(e)
            return e if isinstance(e, int) else model.eval(e, model_completion=True).as_long()

        m, u = ev(self.m), ev(self.u)
        return ev(x.n) * m * u + ev(x.j) * u + ev(x.s)

    def divisible(self, x: Count, c):
        """``x`` is a multiple of ``c*S`` (c >= 1): x a multiple of S and
        ``n = q*c + 0`` (explicit quotient and remainder, so both polarities
        are exact)."""
        c = _num(c)
        if isinstance(c, int) and c == 1:
            return AND(eq(x.j, 0), eq(x.s, 0))

        def build():
            self.nonlinear = True
            q, r = self.fresh("q"), self.fresh("r")
            self.side.append(z3.Implies(c >= 1, z3.And(x.n == q * c + r, 0 <= r, r < c)))
            return r

        r = self.memo(("div", x.key, _key(c)), build)
        return AND(eq(x.j, 0), eq(x.s, 0), r == 0)


class Count:
    """A token count as normalised digits ``(n, j, s)`` of a ``Space``.
    Comparisons return a Python bool when the digits decide, else a z3 Bool."""

    __slots__ = ("sp", "n", "j", "s", "_k")

    def __init__(self, sp: Space, n, j, s):
        self.sp, self.n, self.j, self.s = sp, _num(n), _num(j), _num(s)
        self._k = None

    @property
    def key(self):
        if self._k is None:
            self._k = (_key(self.n), _key(self.j), _key(self.s))
        return self._k

    def __repr__(self) -> str:
        return f"Count({self.n}, {self.j}, {self.s})"

    # -- arithmetic ------------------------------------------------------
    def _coerce(self, other) -> Count:
        if isinstance(other, Count):
            return other
        if isinstance(other, int):
            return self.sp.tokens(other)
        raise TypeError(f"cannot combine a Count with {other!r}")

    def __add__(self, other) -> Count:
        if isinstance(other, int):
            x = self
            for _ in range(abs(other)):
                x = x._inc() if other > 0 else x._dec()
            return x
        if isinstance(other, Unit):
            return other.add(self, 1)
        return self._add(self._coerce(other))

    def __sub__(self, other) -> Count:
        if isinstance(other, int):
            return self + (-other)
        if isinstance(other, Unit):
            return other.add(self, -1)
        return self._sub(self._coerce(other))

    def _inc(self) -> Count:
        sp = self.sp

        def build():
            n, j, s = self.n, self.j, self.s
            s1, j1 = add(s, 1), add(j, 1)
            in_s, in_j = lt(s1, sp.u), lt(j1, sp.m)
            return Count(
                sp,
                sp.let(IF(OR(in_s, in_j), n, add(n, 1)), "n"),
                sp.let(IF(in_s, j, IF(in_j, j1, 0)), "j"),
                sp.let(IF(in_s, s1, 0), "s"),
            )

        return sp.memo(("inc", self.key), build)

    def _dec(self) -> Count:
        sp = self.sp

        def build():
            n, j, s = self.n, self.j, self.s
            s_pos, j_pos = lt(0, s), lt(0, j)
            return Count(
                sp,
                sp.let(IF(OR(s_pos, j_pos), n, sub(n, 1)), "n"),
                sp.let(IF(s_pos, j, IF(j_pos, sub(j, 1), sub(sp.m, 1))), "j"),
                sp.let(IF(s_pos, sub(s, 1), sub(sp.u, 1)), "s"),
            )

        return sp.memo(("dec", self.key), build)

    def add_u(self, k: int) -> Count:
        """Add k (+1 or -1) blocks of u tokens."""
        sp = self.sp

        def build():
            n, j, s = self.n, self.j, self.s
            if k == 1:
                j1 = add(j, 1)
                c = lt(j1, sp.m)
                return Count(sp, sp.let(IF(c, n, add(n, 1)), "n"), sp.let(IF(c, j1, 0), "j"), s)
            if k == -1:
                c = lt(0, j)
                return Count(sp, sp.let(IF(c, n, sub(n, 1)), "n"), sp.let(IF(c, sub(j, 1), sub(sp.m, 1)), "j"), s)
            raise ValueError("add_u takes +1 or -1")

        return sp.memo(("addu", k, self.key), build)

    def add_S(self, k: int) -> Count:
        """Add k blocks of S tokens (memoised like every other digit
        operation, so that a rule built twice, e.g. the chunk anchors of two
        predicates over the same prompt, names the same digits)."""
        sp = self.sp
        return sp.memo(("addS", k, self.key), lambda: Count(sp, sp.let(add(self.n, k), "n"), self.j, self.s))

    def _add(self, o: Count) -> Count:
        sp = self.sp

        def build():
            s = add(self.s, o.s)
            c1 = NOT(lt(s, sp.u))
            s2 = sp.let(IF(c1, sub(s, sp.u), s), "s")
            j = add(add(self.j, o.j), IF(c1, 1, 0))
            c2 = NOT(lt(j, sp.m))
            return Count(sp, sp.let(add(add(self.n, o.n), IF(c2, 1, 0)), "n"), sp.let(IF(c2, sub(j, sp.m), j), "j"), s2)

        return sp.memo(("add", self.key, o.key), build)

    def _sub(self, o: Count) -> Count:
        sp = self.sp

        def build():
            s = sub(self.s, o.s)
            b1 = lt(s, 0)
            s2 = sp.let(IF(b1, add(s, sp.u), s), "s")
            j = sub(sub(self.j, o.j), IF(b1, 1, 0))
            b2 = lt(j, 0)
            return Count(sp, sp.let(sub(sub(self.n, o.n), IF(b2, 1, 0)), "n"), sp.let(IF(b2, add(j, sp.m), j), "j"), s2)

        return sp.memo(("sub", self.key, o.key), build)

    # -- flooring ----------------------------------------------------------
    def floor_S(self) -> Count:
        return Count(self.sp, self.n, 0, 0)

    def floor_u(self) -> Count:
        return Count(self.sp, self.n, self.j, 0)

    # -- comparisons -------------------------------------------------------
    def _lt(self, o: Count):
        if self.key == o.key:
            return False
        return self.sp.memo(
            ("lt", self.key, o.key),
            lambda: OR(
                lt(self.n, o.n), AND(eq(self.n, o.n), OR(lt(self.j, o.j), AND(eq(self.j, o.j), lt(self.s, o.s))))
            ),
        )

    def __lt__(self, other):
        return self._lt(self._coerce(other))

    def __le__(self, other):
        return NOT(self._coerce(other)._lt(self))

    def __gt__(self, other):
        return self._coerce(other)._lt(self)

    def __ge__(self, other):
        return NOT(self._lt(self._coerce(other)))

    def __eq__(self, other):  # type: ignore[override]
        o = self._coerce(other)
        if self.key == o.key:
            return True
        return self.sp.memo(("eq", self.key, o.key), lambda: AND(eq(self.n, o.n), eq(self.j, o.j), eq(self.s, o.s)))

    def __ne__(self, other):  # type: ignore[override]
        return NOT(self.__eq__(other))

    __hash__ = object.__hash__


class Unit:
    """A block unit of a geometry class: ``S``, ``u``, or (hybrid) a choice
    between them decided by a z3 Bool (``S`` when ``is_S`` holds)."""

    def __init__(self, name: str, is_S):
        self.name = name
        self.is_S = is_S  # True, False, or a z3 Bool

    def add(self, x: Count, k: int) -> Count:
        if self.is_S is True:
            return x.add_S(k)
        if self.is_S is False:
            return x.add_u(k)
        return x.sp.ite(self.is_S, x.add_S(k), x.add_u(k))

    def floor(self, x: Count) -> Count:
        if self.is_S is True:
            return x.floor_S()
        if self.is_S is False:
            return x.floor_u()
        return x.sp.ite(self.is_S, x.floor_S(), x.floor_u())

    def divides(self, x: Count):
        """x is a multiple of this unit."""
        if self.is_S is True:
            return AND(eq(x.j, 0), eq(x.s, 0))
        if self.is_S is False:
            return eq(x.s, 0)
        return AND(eq(x.s, 0), z3.Implies(self.is_S, to_z3(eq(x.j, 0))))

    def __repr__(self) -> str:
        return f"Unit({self.name})"
