"""The cheap argument check in front of ``inspect.Signature.bind``: a call it lets
through must bind, and one that does not bind must still raise TypeError."""

from __future__ import annotations

import inspect

import pytest

from monarch_kernel.mesh._actor_mesh import _positional_range


def _methods():
    def plain(self, a, b=1): ...
    def none(self): ...
    def star(self, a, *rest): ...
    def kwonly_default(self, a, *, k=1): ...
    def kwonly_required(self, a, *, k): ...
    def posonly(self, a, /, b=2): ...
    def kwargs(self, a, **kw): ...

    return [plain, none, star, kwonly_default, kwonly_required, posonly, kwargs]


@pytest.mark.parametrize("fn", _methods(), ids=lambda f: f.__name__)
@pytest.mark.parametrize("n", range(5))
def test_the_fast_check_agrees_with_bind(fn, n):
    sig = inspect.signature(fn)
    lo, hi = _positional_range(sig)
    args = tuple(range(n))
    try:
        sig.bind(None, *args)
        binds = True
    except TypeError:
        binds = False
    if lo <= n <= hi:  # the fast path skips bind: it must be right to
        assert binds


def test_each_endpoint_property_keeps_its_own_signature_when_an_earlier_one_is_freed():
    """``as_endpoint`` makes a property per call and drops it after; a later property at
    the freed one's address must still get its own method's signature (a table keyed by
    ``id`` gave it the old method's, and calls failed with "too many positional
    arguments")."""
    from monarch_kernel.actor import EndpointProperty
    from monarch_kernel.mesh._actor_mesh import _signature

    def one(self, a): ...
    def three(self, a, b, c): ...

    for i in range(200):
        fn = (one, three)[i % 2]
        assert list(_signature(EndpointProperty(fn)).parameters) == list(inspect.signature(fn).parameters)
