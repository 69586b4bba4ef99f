import sys

from hg_dagger.cli import main

sys.exit(main())
