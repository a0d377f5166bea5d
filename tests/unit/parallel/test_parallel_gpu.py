"""CUDA block kernels and the simulated ring in bf16 (skipped without a GPU): the real kernels on
one device, every ring step in one process, no communication (tests/integration/test_gpu.py says what one GPU
cannot check, and where that is covered)."""

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


@pytest.mark.parametrize("layout", ["striped", "zigzag"])
def test_cuda_document_masked_ring_bf16(layout):
    """Packed documents on CUDA: the ring's pieces run on the CUDA flash kernel in bf16; output
    and q/k/v gradients against the fp64 block-diagonal reference."""
    from document_refs import masked_sdpa, packings

    seg = packings(2, 1024, seed=0, lengths=(1, 7, 100, 300, 700)).cuda()
    full = [torch.randn(2, h, 1024, 64, device="cuda", dtype=torch.float64) for h in (8, 2, 2)]
    low = [t.bfloat16().requires_grad_() for t in full]
    ref_in = [t.clone().requires_grad_() for t in full]
    out = simulate_ring(*low, 4, True, layout, segment_ids=seg)
    ref = masked_sdpa(*ref_in, seg, True)
    dout = torch.randn_like(ref)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    for a, b in zip(torch.autograd.grad(out, low, dout.bfloat16()), torch.autograd.grad(ref, ref_in, dout)):
        torch.testing.assert_close(a.double(), b, atol=5e-2, rtol=5e-2)


def test_cuda_per_document_sdpa_bf16():
    from document_refs import masked_sdpa, packings

    from lwm.model.documents import document_attention

    seg = packings(2, 1024, seed=1, lengths=(1, 7, 100, 300, 700)).cuda()
    q, k, v = (torch.randn(2, h, 1024, 64, device="cuda", dtype=torch.bfloat16) for h in (8, 2, 2))
    ref = masked_sdpa(q.double(), k.double(), v.double(), seg, True)
    torch.testing.assert_close(document_attention(q, k, v, seg).double(), ref, atol=2e-2, rtol=2e-2)
