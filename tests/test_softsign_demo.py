"""Test-only activation of issue 24's demo: softsign (code 12), added through csrc/core/act/act_functors.h alone
(functor + one table row), reached here through torch.ops.te.act / dact with its code."""
import torch

import transformer_engine_torch  # noqa: F401  (loads the ops)

SOFTSIGN = 12


def test_softsign_forward_and_backward():
    x = torch.linspace(-6, 6, 97, dtype=torch.float32).reshape(1, 97)
    y = torch.ops.te.act(x, SOFTSIGN, 7.0, 1.702, 1.0)
    torch.testing.assert_close(y, x / (1 + x.abs()), rtol=2e-7, atol=0)
    g = torch.full_like(x, 0.5)
    dx = torch.ops.te.dact(g, x, SOFTSIGN, 7.0, 1.702, 1.0)
    torch.testing.assert_close(dx, g / (1 + x.abs()) ** 2, rtol=4e-7, atol=0)
    assert not torch.equal(y, x / (1 + x.abs()) + 1e-3)  # a wrong answer would fail
