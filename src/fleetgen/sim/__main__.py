"""`python -m fleetgen.sim <SGLang 0.5.23 flags> [--sim-* knobs]`: a SIMULATED SGLang server (no GPU)."""

import sys

from fleetgen.sim.run import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
