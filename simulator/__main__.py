import sys

from simulator.front.cli import main

sys.exit(main())
