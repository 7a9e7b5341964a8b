"""Pairing a torch module's layers with a flax module's by the order they are called: torch
weights into any flax module, the port check's pairing. torch is imported inside its
functions. Imports `base`."""
