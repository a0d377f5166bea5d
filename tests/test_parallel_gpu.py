"""CUDA block kernels and the simulated ring in bf16 (skipped without a GPU)."""

import pytest
import torch
import torch.nn.functional as F

from lwm.parallel import block_backward, block_forward, simulate_ring
from lwm.parallel.kernels import select_backend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("d", [64, 128, 80])
def test_cuda_flash_block_matches_math(causal, d):
    q = torch.randn(2, 8, 256, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 256, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    assert select_backend(q) == "cuda_flash"
    out, lse = block_forward(q, k, v, causal)
    ref_out, ref_lse = block_forward(q.double(), k.double(), v.double(), causal, backend="math")
    torch.testing.assert_close(out.double(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-2, rtol=1e-3)
    dout = torch.randn_like(out)
    got = block_backward(dout, q, k, v, out, lse, causal)
    ref = block_backward(dout.double(), q.double(), k.double(), v.double(), ref_out, ref_lse, causal, backend="math")
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("layout", ["striped", "zigzag"])
def test_cuda_simulated_ring_bf16(layout):
    q = torch.randn(1, 8, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, 8, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    out = simulate_ring(q, k, v, 4, True, layout)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
