"""Training the VQGAN (train_vqgan.py): the LightningModule (lit_vqgan), the GAN's discriminator,
video frames as a datamodule (frames), reconstruction grids, and the run's configs (config,
run_config). Lightning is imported here, never by the model in lwm.vision."""
