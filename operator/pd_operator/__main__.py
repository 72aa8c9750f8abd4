import sys

from .controller.main import main

sys.exit(main())
