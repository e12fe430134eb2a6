import sys

from tunecl.cli import main

sys.exit(main())
