"""sbench: a SLURM / bare-metal benchmark harness for LLM fine-tuning."""

__version__ = "0.1.0"
