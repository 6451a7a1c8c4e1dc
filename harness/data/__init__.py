"""What a job reads, made once and shared by every node: synthetic datasets (``datagen``), exact token
counts (``tokens``), the prepared training data (``prepared``), model weights (``models``), the tiny test
model (``tinymodel``) and the fms-hf-tuning environments (``trainerenv``)."""
