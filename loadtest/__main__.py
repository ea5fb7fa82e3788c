import sys

if sys.argv[1:2] == ["verify"]:  # its own module (loadtest/verify_cmd.py): a baseline and the verify phase
    from loadtest.verify_cmd import main as verify_main

    sys.exit(verify_main(sys.argv[2:]))

from loadtest.cli import main

sys.exit(main())
