import sys

from timelyllm_ros.bags.cli import main

sys.exit(main())
