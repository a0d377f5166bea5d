"""Training the VQGAN (train_vqgan.py; floor 11, beside train.py's runs, on the core's trainer settings and
learning-rate factor): the LightningModule (lit_vqgan), the GAN's discriminator, video frames as a
datamodule (frames), reconstruction grids, and the run's configs (config). Lightning is imported here,
never by the model in lwm.vision."""
