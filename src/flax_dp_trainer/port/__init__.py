"""Torch weights into any flax module of the same architecture, without a key table: each
side's layers in call order (`layers`), their arrays between layouts (`layouts`), paired and
carried, their outputs captured (`porting`). Imports `base`."""
