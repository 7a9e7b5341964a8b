"""`python -m flax_dp_trainer --config=NAME_OR_PATH --workdir=DIR`: trains (`main`)."""

from absl import flags

from flax_dp_trainer import main

# --helpshort lists the flags of the module run as __main__: this one, which has main's.
flags.adopt_module_key_flags(main)
main.run()
