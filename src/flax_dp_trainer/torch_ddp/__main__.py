"""`python -m flax_dp_trainer.torch_ddp`, the twin's old command, kept for one release: the
package's warning (its import, before this runs), then `python -m
flax_dp_trainer.pytorch.twin` with the same flags."""

import runpy

runpy.run_module('flax_dp_trainer.pytorch.twin', run_name='__main__', alter_sys=True)
