import pytest
import torch
import torch.nn.functional as F

from lwm.vision import VQGAN, VQGANConfig
from lwm.vision.quantizer import VectorQuantizer

# aMUSEd's VQ model (the VQGAN LWM used), as a diffusers VQModel config.
AMUSED_VQ = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 5,
    up_block_types=("UpDecoderBlock2D",) * 5,
    block_out_channels=(128, 256, 256, 512, 768),
    layers_per_block=2,
    act_fn="silu",
    latent_channels=64,
    num_vq_embeddings=8192,
    norm_num_groups=32,
    vq_embed_dim=64,
    norm_type="group",
    mid_block_add_attention=False,
    lookup_from_codebook=True,
    force_upcast=True,
    scaling_factor=0.18215,
)
# A small VQModel of the same kind: 64x64 -> 16x16 codes.
TINY_VQ = {
    **AMUSED_VQ,
    "down_block_types": ("DownEncoderBlock2D",) * 3,
    "up_block_types": ("UpDecoderBlock2D",) * 3,
    "block_out_channels": (32, 64, 64),
    "layers_per_block": 1,
    "latent_channels": 16,
    "vq_embed_dim": 16,
    "norm_num_groups": 8,
}


def vq_model(config: dict, seed: int = 0):
    from diffusers import VQModel

    torch.manual_seed(seed)
    model = VQModel(**config).eval()
    # Codebook on the scale of the encoder's outputs (std ~0.2 at init), so codes are spread out;
    # diffusers' own init (uniform +-1/8192) makes every code about equally far.
    with torch.no_grad():
        model.quantize.embedding.weight.normal_(0, 0.2)
    return model


def to_float(frames: torch.Tensor) -> torch.Tensor:
    return frames.permute(0, 3, 1, 2).float() / 127.5 - 1  # (T, H, W, 3) uint8 -> (T, 3, H, W) in [-1, 1]


@torch.no_grad()
def diffusers_codes(model, x: torch.Tensor) -> torch.Tensor:
    """diffusers' own path: encoder -> quant_conv -> VectorQuantizer indices, as (T, h*w)."""
    latents = model.encode(x).latents
    _, _, (_, _, indices) = model.quantize(latents)
    return indices.view(x.shape[0], -1)


@torch.no_grad()
def diffusers_decode(model, codes: torch.Tensor, side: int) -> torch.Tensor:
    """aMUSEd's path: codebook lookup (lookup_from_codebook) -> post_quant_conv -> decoder."""
    shape = (codes.shape[0], side, side, model.config.vq_embed_dim)
    return model.decode(codes.reshape(-1), force_not_quantize=True, shape=shape).sample


@pytest.fixture(scope="module")
def amused():
    """aMUSEd-shaped VQModel (146M parameters, random weights) and our import of it; built once."""
    import diffusers  # noqa: F401

    from lwm.interop.diffusers import from_diffusers

    reference = vq_model(AMUSED_VQ)
    return reference, from_diffusers(reference).eval()


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return VQGAN(VQGANConfig.from_preset("tiny")).eval()


def frames_u8(t: int, side: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (t, side, side, 3), dtype=torch.uint8, generator=g)


# ---------------------------------------------------------------------------------------- diffusers parity


def test_amused_codes_identical_and_decode_matches_diffusers(amused):
    reference, ours = amused
    assert ours.config == VQGANConfig.from_preset("lwm")
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters()) == 146_244_675
    frames = frames_u8(1, 256)  # one frame: many frames a batch are the tiny model's test below
    codes = ours.encode(frames)
    expected = diffusers_codes(reference, to_float(frames))
    assert codes.shape == (1, 256) and codes.dtype == torch.long
    assert torch.equal(codes, expected)
    assert codes.unique().numel() > 50  # a real spread of codes, not one code everywhere
    # Decoding is the slow half (~8 s a 256 x 256 frame for each model on one core): the decoder is
    # convolutions and a mid-block attention, the same at any size, so an 8 x 8 corner of one frame's
    # codes (a 128 x 128 picture), through the same lookup and decoder that decode() runs.
    # Tolerance: same ops in the same order (equal in practice); 1e-4 leaves room for kernel choice.
    corner = codes.view(1, 16, 16)[:, :8, :8].reshape(1, 64)
    mine = ours.decoder(ours.quantizer.lookup(corner, 8, 8))
    torch.testing.assert_close(mine, diffusers_decode(reference, corner, 8), atol=1e-4, rtol=1e-4)
    assert mine.shape == (1, 3, 128, 128)


@torch.no_grad()
def test_tiny_vq_model_forward_matches_diffusers():
    import diffusers  # noqa: F401

    from lwm.interop.diffusers import from_diffusers

    reference = vq_model(TINY_VQ)
    ours = from_diffusers(reference).eval()
    assert ours.config == VQGANConfig.from_preset("tiny")
    x = to_float(frames_u8(3, 64))
    out = ours(x)
    ref = reference(x)
    assert torch.equal(out.codes, diffusers_codes(reference, x))
    torch.testing.assert_close(out.recon, ref.sample, atol=1e-5, rtol=1e-5)
    # diffusers' (legacy) VQ loss is commitment + 0.25 * codebook; both terms have the same value.
    torch.testing.assert_close(out.codebook_loss + 0.25 * out.commitment_loss, ref.commit_loss, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours.decode(out.codes), diffusers_decode(reference, out.codes, 16), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_from_diffusers_folder_round_trip(tmp_path):
    import diffusers  # noqa: F401

    from lwm.interop.diffusers import from_diffusers, to_diffusers

    reference = vq_model(TINY_VQ)
    reference.save_pretrained(tmp_path / "vq")
    reference.save_pretrained(tmp_path / "pipeline" / "vqvae")  # an aMUSEd pipeline folder holds it here
    frames = frames_u8(2, 64)
    expected = diffusers_codes(reference, to_float(frames))
    for folder in (tmp_path / "vq", str(tmp_path / "pipeline")):
        assert torch.equal(from_diffusers(folder).eval().encode(frames), expected)
    # And back: our weights in a VQModel give diffusers' codes again.
    back = to_diffusers(from_diffusers(tmp_path / "vq")).eval()
    for (k, v), (k2, v2) in zip(back.state_dict().items(), reference.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    with pytest.raises(FileNotFoundError, match="not a diffusers VQModel folder"):
        from_diffusers(tmp_path)


def test_from_diffusers_refuses_unsupported_options():
    from lwm.interop.diffusers import config_from_diffusers

    cases = {
        "mid_block_add_attention": {"mid_block_add_attention": True},
        "norm_type": {"norm_type": "spatial"},
        "act_fn": {"act_fn": "gelu"},
        "down_block_types": {"down_block_types": ("AttnDownEncoderBlock2D",) + ("DownEncoderBlock2D",) * 4},
    }
    for name, change in cases.items():
        with pytest.raises(ValueError, match=f"unsupported VQModel options .*{name}"):
            config_from_diffusers({**AMUSED_VQ, **change})
    with pytest.raises(ValueError, match=r"block_out_channels \[128, 192\] must be multiples of the first, 128"):
        config_from_diffusers(
            {
                **AMUSED_VQ,
                "block_out_channels": (128, 192),
                "down_block_types": ("DownEncoderBlock2D",) * 2,
                "up_block_types": ("UpDecoderBlock2D",) * 2,
            }
        )
    # The defaults of diffusers' VQModel (mid-block attention) are refused too when left out.
    with pytest.raises(ValueError, match="mid_block_add_attention"):
        config_from_diffusers({k: v for k, v in AMUSED_VQ.items() if k != "mid_block_add_attention"})


# ---------------------------------------------------------------------------------------- presets and API


def test_presets_give_256_codes_per_frame():
    lwm, tiny = VQGANConfig.from_preset("lwm"), VQGANConfig.from_preset("tiny")
    assert lwm.block_out_channels == (128, 256, 256, 512, 768) and lwm.downsample == 16 and lwm.n_codes == 8192
    assert tiny.downsample == 4 and tiny.n_codes == 8192
    assert lwm.tokens_per_frame == tiny.tokens_per_frame == 256
    with torch.device("meta"):  # shapes only: 146M parameters never allocated
        model = VQGAN(lwm)
    codes = model.encode(torch.empty(2, 256, 256, 3, dtype=torch.uint8, device="meta"))
    assert codes.shape == (2, 256) and codes.dtype == torch.long
    assert model.decode(torch.empty(2, 256, dtype=torch.long, device="meta")).shape == (2, 3, 256, 256)


def test_tiny_encode_decode(tiny):
    frames = frames_u8(5, 64)
    codes = tiny.encode(frames)
    assert codes.shape == (5, 256) and codes.dtype == torch.long
    assert 0 <= int(codes.min()) and int(codes.max()) < 8192
    assert codes.unique().numel() > 1
    # Every input form and batch size gives the same codes.
    assert torch.equal(tiny.encode(to_float(frames)), codes)
    assert torch.equal(tiny.encode(frames.numpy()), codes)
    assert torch.equal(tiny.encode(frames, batch_size=2), codes)
    assert torch.equal(tiny.encode(to_float(frames).to(memory_format=torch.channels_last)), codes)
    recon = tiny.decode(codes)
    assert recon.shape == (5, 3, 64, 64) and recon.dtype == torch.float32 and recon.isfinite().all()
    torch.testing.assert_close(tiny.decode(codes, batch_size=3), recon, atol=1e-6, rtol=1e-6)
    assert tiny.encode(frames[:0]).shape == (0, 256)
    assert tiny.decode(codes[:0]).shape == (0, 3, 64, 64)


def test_bf16_encode_keeps_fp32_distances(tiny):
    # The model in bf16 still returns long codes in range; the distances are computed in fp32.
    model = VQGAN(tiny.config)
    model.load_state_dict(tiny.state_dict())
    codes = model.to(torch.bfloat16).eval().encode(frames_u8(2, 64))
    assert codes.dtype == torch.long and codes.shape == (2, 256) and int(codes.max()) < 8192


@pytest.mark.parametrize(
    "frames, message",
    [
        (
            torch.zeros(64, 64, 3, dtype=torch.uint8),
            r"frames must be \(T, 64, 64, 3\) uint8 or \(T, 3, 64, 64\) float .* got shape \(64, 64, 3\)",
        ),
        (
            torch.zeros(2, 3, 64, 64, dtype=torch.uint8),
            r"uint8 frames must be channels-last .* got shape \(2, 3, 64, 64\) dtype torch.uint8",
        ),
        (
            torch.zeros(2, 64, 64, 3),
            r"float frames must be channels-first .* got shape \(2, 64, 64, 3\) dtype torch.float32",
        ),
        (torch.zeros(2, 32, 32, 3, dtype=torch.uint8), r"frames are 32x32 but this VQGAN takes 64x64"),
        (torch.zeros(2, 3, 64, 48), r"frames are 64x48 but this VQGAN takes 64x64"),
        (torch.zeros(2, 64, 64, 3, dtype=torch.int64), r"frames must be uint8 or floating point.* dtype torch.int64"),
        (torch.full((2, 3, 64, 64), 255.0), r"float frames must be in \[-1, 1\], got values in \[255, 255\]"),
    ],
)
def test_encode_rejects_bad_frames(tiny, frames, message):
    with pytest.raises(ValueError, match=message):
        tiny.encode(frames)


@pytest.mark.parametrize(
    "codes, message",
    [
        (torch.zeros(2, 255, dtype=torch.long), r"codes must be \(T, 256\); got shape \(2, 255\)"),
        (torch.zeros(256, dtype=torch.long), r"codes must be \(T, 256\); got shape \(256,\)"),
        (torch.zeros(2, 256), r"codes must be an integer tensor .* dtype torch.float32"),
        (torch.full((2, 256), 8192), r"codes must be in \[0, 8192\), got values in \[8192, 8192\]"),
        (torch.full((2, 256), -1), r"codes must be in \[0, 8192\), got values in \[-1, -1\]"),
    ],
)
def test_decode_rejects_bad_codes(tiny, codes, message):
    with pytest.raises(ValueError, match=message):
        tiny.decode(codes)


def test_config_validation_messages_have_values():
    cases = [
        (dict(resolution=250), r"resolution 250 is not divisible by the downsampling 16"),
        (
            dict(resolution=512),
            r"resolution 512 / downsampling 16 gives 32x32 = 1024 codes per frame.*use resolution 256",
        ),
        (
            dict(norm_groups=24),
            r"block channels \[128, 256, 256, 512, 768\] .* divisible by norm_groups 24; \[128, 256, 256, 512\]",
        ),
        (dict(channel_mult=()), r"channel_mult must be a non-empty tuple of positive integers, got \(\)"),
        (dict(n_codes=0), r"VQGANConfig.n_codes must be a positive integer, got 0"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):
            VQGANConfig.from_preset("lwm", **overrides)
    with pytest.raises(ValueError, match=r"unknown VQGAN preset 'huge'; expected one of \['lwm', 'tiny'\]"):
        VQGANConfig.from_preset("huge")
    assert VQGANConfig.from_preset("tiny", channel_mult=[1, 2, 2]).channel_mult == (1, 2, 2)  # lists from Hydra


# ---------------------------------------------------------------------------------------- quantizer


def test_quantizer_codes_and_losses_match_direct_computation():
    q = VectorQuantizer(n_codes=512, code_dim=8)
    with torch.no_grad():
        q.codebook.weight.normal_()
    z = torch.randn(2, 8, 4, 5, requires_grad=True)
    out = q(z)
    flat = z.detach().permute(0, 2, 3, 1).reshape(-1, 8)  # (B, D, h, w) -> (B*h*w, D)
    direct = ((flat[:, None, :] - q.codebook.weight.detach()[None]) ** 2).sum(-1).argmin(-1)
    assert torch.equal(out.codes, direct.view(2, 20))
    e = q.codebook.weight.detach()[direct].view(2, 4, 5, 8).permute(0, 3, 1, 2)
    mse = ((e - z.detach()) ** 2).mean()
    torch.testing.assert_close(out.codebook_loss, mse)
    torch.testing.assert_close(out.commitment_loss, mse)
    torch.testing.assert_close(out.z_q, e)  # forward value: the codes' vectors


def test_quantizer_gradients_straight_through_and_loss_targets():
    q = VectorQuantizer(n_codes=64, code_dim=4)
    z = torch.randn(2, 4, 3, 3, requires_grad=True)
    out = q(z)
    # Straight through: the gradient of z_q passes to z unchanged, and not to the codebook.
    g = torch.randn_like(z)
    (out.z_q * g).sum().backward(retain_graph=True)
    assert torch.equal(z.grad, g) and q.codebook.weight.grad is None
    z.grad = None
    # The codebook loss trains only the codebook; the commitment loss only the encoder side.
    out.codebook_loss.backward(retain_graph=True)
    assert z.grad is None and q.codebook.weight.grad.abs().sum() > 0
    used = q.codebook.weight.grad.abs().sum(1) > 0
    assert set(used.nonzero().flatten().tolist()) == set(out.codes.unique().tolist())
    q.codebook.weight.grad = None
    out.commitment_loss.backward()
    assert q.codebook.weight.grad is None
    torch.testing.assert_close(z.grad, 2 * (z - out.z_q).detach() / z.numel())


def test_vqgan_training_step_reaches_encoder_codebook_and_decoder(tiny):
    model = VQGAN(tiny.config)
    x = to_float(frames_u8(2, 64))
    out = model(x)
    assert out.recon.shape == x.shape and out.codes.shape == (2, 256)
    loss = F.mse_loss(out.recon, x) + out.codebook_loss + 0.25 * out.commitment_loss
    loss.backward()
    for name in (
        "encoder.conv_in.weight",
        "encoder.quant_conv.weight",
        "quantizer.codebook.weight",
        "decoder.conv_out.weight",
    ):
        grad = model.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name
    # The reconstruction term alone reaches the encoder only through the straight-through estimator.
    model.zero_grad()
    F.mse_loss(model(x).recon, x).backward()
    assert model.encoder.conv_in.weight.grad.abs().sum() > 0 and model.quantizer.codebook.weight.grad is None
