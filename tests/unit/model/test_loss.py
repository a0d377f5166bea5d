import pytest
import torch
import torch.nn.functional as F

from lwm.model import IGNORE_INDEX, ModelConfig, Transformer, chunked_cross_entropy, token_coefficients


def plain_weighted_loss(logits, targets, loss_mask, vision_mask, tw, vw):
    """The plain path: full logits, F.cross_entropy, explicit separate means."""
    ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none").view(targets.shape)
    text, vis = loss_mask * ~vision_mask, loss_mask * vision_mask
    terms, weights = [], []
    if text.sum() > 0:
        terms.append(tw * (ce * text).sum() / text.sum())
        weights.append(tw)
    if vis.sum() > 0:
        terms.append(vw * (ce * vis).sum() / vis.sum())
        weights.append(vw)
    return sum(terms) / sum(weights)


def make_batch(vocab, B=2, S=37, vision=True):
    targets = torch.randint(0, vocab, (B, S))
    loss_mask = (torch.rand(B, S) > 0.2).float()
    vision_mask = (torch.rand(B, S) > 0.5) if vision else torch.zeros(B, S, dtype=torch.bool)
    return targets, loss_mask, vision_mask


@pytest.mark.parametrize("chunk", [1, 8, 37, 100])
@pytest.mark.parametrize("tw,vw,vision", [(0.5, 0.5, True), (0.3, 0.7, True), (0.5, 0.5, False)])
def test_model_loss_matches_plain_path(chunk, tw, vw, vision):
    cfg = ModelConfig.from_preset("debug", loss_chunk_size=chunk)
    model_a, model_b = Transformer(cfg), Transformer(cfg)
    model_b.load_state_dict(model_a.state_dict())
    tokens = torch.randint(0, cfg.vocab_size, (2, 37))
    targets, loss_mask, vision_mask = make_batch(cfg.vocab_size, vision=vision)

    ref = plain_weighted_loss(model_a(tokens), targets, loss_mask, vision_mask, tw, vw)
    ref.backward()
    coeff = token_coefficients(loss_mask, vision_mask, tw, vw)
    out = model_b(tokens, targets=targets, loss_coeff=coeff)
    out.loss.backward()

    torch.testing.assert_close(out.loss, ref, atol=1e-6, rtol=1e-6)
    for (name, a), b in zip(model_a.named_parameters(), model_b.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-5, msg=name)
    # per-token losses for logging are the unreduced cross entropy
    ce = F.cross_entropy(model_a(tokens).flatten(0, 1), targets.flatten(), reduction="none").view(2, 37)
    torch.testing.assert_close(out.token_loss, ce.detach(), atol=1e-5, rtol=1e-5)


def test_default_is_mean_over_non_ignored_targets():
    hidden = torch.randn(3, 20, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 50, (3, 20))
    targets[0, :5] = IGNORE_INDEX
    out = chunked_cross_entropy(hidden, weight, targets, chunk_size=7)
    ref = F.cross_entropy((hidden @ weight.t()).flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(out.loss, ref)
    gh, gw = torch.autograd.grad(out.loss * 3.0, (hidden, weight))  # a non-unit upstream gradient
    rh, rw = torch.autograd.grad(ref * 3.0, (hidden, weight))
    torch.testing.assert_close(gh, rh, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(gw, rw, atol=1e-6, rtol=1e-5)
    assert (out.token_loss[0, :5] == 0).all()


def test_bf16_loss_and_grads_close_to_fp32():
    hidden = torch.randn(2, 64, 32)
    weight = torch.randn(300, 32) * 0.1
    targets = torch.randint(0, 300, (2, 64))
    h32, w32 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h16, w16 = hidden.bfloat16().requires_grad_(), weight.bfloat16().requires_grad_()
    l32 = chunked_cross_entropy(h32, w32, targets, chunk_size=16).loss
    l16 = chunked_cross_entropy(h16, w16, targets, chunk_size=16).loss
    l32.backward(), l16.backward()
    assert l16.dtype == torch.float32 and w16.grad.dtype == torch.bfloat16
    torch.testing.assert_close(l16, l32, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(w16.grad.float(), w32.grad, atol=2e-3, rtol=3e-2)
    torch.testing.assert_close(h16.grad.float(), h32.grad, atol=2e-3, rtol=3e-2)


def test_coefficients_use_given_global_counts():
    """Split a batch in two (as context-parallel ranks would): with global counts, the two
    partial losses add up to the loss of the whole batch."""
    targets, loss_mask, vision_mask = make_batch(40, B=1, S=30)
    hidden, weight = torch.randn(1, 30, 8), torch.randn(40, 8)
    whole = chunked_cross_entropy(hidden, weight, targets, token_coefficients(loss_mask, vision_mask)).loss
    from lwm.model import group_counts

    counts = group_counts(loss_mask, vision_mask)
    parts = [
        chunked_cross_entropy(
            hidden[:, s], weight, targets[:, s], token_coefficients(loss_mask[:, s], vision_mask[:, s], counts=counts)
        ).loss
        for s in (slice(0, 13), slice(13, 30))
    ]
    torch.testing.assert_close(parts[0] + parts[1], whole)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"targets \(2, 5\) must match hidden \(2, 6, 8\)"):
        chunked_cross_entropy(torch.randn(2, 6, 8), torch.randn(10, 8), torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="loss_mask .* and vision_mask .* differ in shape"):
        token_coefficients(torch.ones(2, 3), torch.ones(2, 4, dtype=torch.bool))


@pytest.mark.parametrize("chunk", [4, 1024])
def test_loss_rows_compute_only_the_weighted_positions_and_change_nothing(chunk):
    """A batch whose loss weight is on few positions (answers): given those rows, the head runs on
    them only (its products for n instead of B * S rows: torch's FLOP counter counts the logits' and
    the hidden gradient's, not the weight gradient's in-place addmm_) and the loss, both gradients
    and the weighted positions' token losses equal the all-rows path's (fp32, summed in other
    chunks: 1e-6)."""
    from torch.utils.flop_counter import FlopCounterMode

    B, S, D, V = 2, 40, 16, 300
    hidden = torch.randn(B, S, D, requires_grad=True)
    weight = torch.randn(V, D, requires_grad=True)
    targets = torch.randint(0, V, (B, S))
    loss_mask = torch.zeros(B, S)
    loss_mask[0, 30:34] = 1.0  # a 4-token answer in each example
    loss_mask[1, 10:14] = 0.5
    coeff = token_coefficients(loss_mask, torch.zeros(B, S, dtype=torch.bool))
    rows = loss_mask.reshape(-1).nonzero().squeeze(1)

    flops, got = {}, {}
    for name, r in (("all", None), ("rows", rows)):
        with FlopCounterMode(display=False) as counter:
            out = chunked_cross_entropy(hidden, weight, targets, coeff, chunk, rows=r)
        flops[name] = counter.get_total_flops()
        got[name] = (out, *torch.autograd.grad(out.loss * 2.0, (hidden, weight)))
    assert flops["all"] == 2 * 2 * B * S * D * V and flops["rows"] == 2 * 2 * rows.numel() * D * V
    (a, ah, aw), (b, bh, bw) = got["all"], got["rows"]
    torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(bh, ah, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(bw, aw, atol=1e-6, rtol=1e-6)
    weighted = loss_mask > 0
    torch.testing.assert_close(b.token_loss[weighted], a.token_loss[weighted], atol=1e-6, rtol=1e-6)
    assert (b.token_loss[~weighted] == 0).all()
    with pytest.raises(ValueError, match=r"rows must be \(n,\) with n <= 80 positions, got \(1, 8\)"):
        chunked_cross_entropy(hidden, weight, targets, coeff, chunk, rows=rows[None])


def test_loss_rows_on_the_gpus_settings_need_no_values_and_no_host_sync():
    """The rows path as a GPU runs it (bf16 hidden states and head, fp32 coefficients), on the meta device
    and under FakeTensorMode, where no tensor has values: every shape follows from the rows' own shape
    (known on the host), so it runs without a value read, and the planner's op counter sees no host
    sync in forward or backward; the loss is fp32, the gradients keep bf16."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lwm.plan.fake import OpCounter

    B, S, D, V, n = 2, 64, 16, 300, 9
    for context in (torch.device("meta"), FakeTensorMode()):
        with context:
            hidden = torch.empty(B, S, D, dtype=torch.bfloat16, requires_grad=True)
            weight = torch.empty(V, D, dtype=torch.bfloat16, requires_grad=True)
            targets = torch.zeros(B, S, dtype=torch.long)
            coeff = torch.empty(B, S, dtype=torch.float32)
            rows = torch.empty(n, dtype=torch.long)
            with OpCounter() as counter:
                out = chunked_cross_entropy(hidden, weight, targets, coeff, chunk_size=4, rows=rows)
                out.loss.backward()
        assert counter.syncs() == {}, counter.syncs()
        assert out.loss.dtype == torch.float32 and out.token_loss.shape == (B, S)
        assert hidden.grad.dtype == weight.grad.dtype == torch.bfloat16 and hidden.grad.shape == (B, S, D)
