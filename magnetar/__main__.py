import sys

from magnetar.cli import main

sys.exit(main())
