"""`python -m flax_dp_trainer --config=NAME_OR_PATH --workdir=DIR`: trains (`main`)."""

from flax_dp_trainer import main

main.run()
