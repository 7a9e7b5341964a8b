"""Torch weights into any flax module of the same architecture, without a key table: each
side's layers in call order (`call_order`), their arrays between layouts (`weight_layouts`),
paired and carried, their outputs captured (`porting`); a torch original built from its import
path (`originals`) and a state dict carried into a port (`weights`); the port check's modes
(`modes`), teacher forcing (`forcing`), causes (`causes`) and judging (`judging`). Imports
`base`, `trace` (flax's variable reads in order) and `zoo`."""

from flax_dp_trainer.base import triton_guard

triton_guard.keep_triton_out_after_tensorflow()  # Before a user's torch model imports torchvision.
