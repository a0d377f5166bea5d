"""Training the VQGAN (train_vqgan.py; floor 12, above train.py's runs, whose trainer settings and learning-rate
factor it shares): the LightningModule (lit_vqgan), the GAN's discriminator,
video frames as a datamodule (frames), reconstruction grids, and the run's configs (config,
run_config). Lightning is imported here, never by the model in lwm.vision."""
