import sys

from dra_gpu.cli import main

sys.exit(main())
