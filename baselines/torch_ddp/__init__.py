"""PyTorch twins of the trainer's models, for DistributedDataParallel comparisons.

Installed with the `ddp` extra (`pip install -e ".[ddp]"`); the trainer itself never imports
torch.
"""
