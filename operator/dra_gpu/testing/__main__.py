import sys

from dra_gpu.testing._cluster import main

sys.exit(main())
