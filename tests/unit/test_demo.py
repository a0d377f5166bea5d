from lwm.demo import run


def test_demo_loss_falls():
    losses = run("debug", steps=8, seq_len=64, batch=2)
    assert len(losses) == 8
    assert losses[-1] < losses[0] - 0.5
