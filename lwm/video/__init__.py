"""Video in: reading frames by rate or count, streamed (reader), and lwm-tokenize, which turns
videos into VQGAN codes for training (tokenize)."""
