import sys

from loadtest.commands.main import main

sys.exit(main())
