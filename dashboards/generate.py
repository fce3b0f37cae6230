#!/usr/bin/env python3
"""`make dashboards` and `make dashboards-check` run this: the generator is exporter/mixin/dashboards/generate.py."""

import sys

from exporter.mixin.dashboards.generate import main

sys.exit(main())
