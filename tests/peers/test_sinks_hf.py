"""gpt-oss's attention (attention sinks) against the module inside its tiny random model (tests/hf_cases_sinks.py,
200 positions): the sinks matter there, and the block decodes to the module's output with the growing cache
and with the static one."""

import pytest
import torch

import zoo
import zoo.heads  # zoo loads its modules on first use; this file reads zoo.heads directly

pytest.importorskip("transformers")
from test_hf import ATOL, capture  # noqa: E402  (after the importorskip)


def test_the_sinks_bite_at_the_cases_sizes():
    c = capture("gpt-oss-sliding")
    block = zoo.from_hf(c.module)
    without = zoo.heads.build(block.spec.replace(sinks=False), zoo.get_projections(block))
    with torch.no_grad():
        miss = (without(c.x, mask=c.keep[:, None, None, :]) - c.y).abs().max().item()
    assert miss > 1e-3, f"the sinks make no difference here ({miss:.1e})"


@pytest.mark.parametrize("name", ["gpt-oss-sliding", "gpt-oss-full"])
def test_decode_is_the_modules_output(name):
    """A prompt, single steps and a chunk, with the growing cache and the static one, row 1's padding as its
    key_mask: every real position equals the module's output (right padding: row 1's last 3 are not compared)."""
    c = capture(name)
    block = zoo.from_hf(c.module)
    x, keep = c.x, c.keep
    t = x.shape[1]
    cuts = [150, *range(151, 160), t]
    real = keep[:, :, None]
    with torch.no_grad():
        ys, pk, pv, start = [], None, None, 0
        for end in cuts:
            y, pk, pv = block.decode(x[:, start:end], pk, pv, key_mask=keep[:, :end])
            ys.append(y)
            start = end
        grow = torch.cat(ys, 1)
        cache = zoo.StaticCache.empty(block.spec, batch=x.shape[0], max_len=t + 4)
        ys, start = [], 0
        for end in cuts:
            ys.append(block.decode(x[:, start:end], cache=cache, key_mask=keep[:, :end]))
            start = end
        static = torch.cat(ys, 1)
    for kind, y in (("growing", grow), ("static", static)):
        err = ((y - c.y) * real).abs().max().item()
        assert err <= ATOL, f"{name}: {kind} cache decode max abs err {err:.2e} > {ATOL}"
