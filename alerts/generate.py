#!/usr/bin/env python3
"""`make generate` and `make alerts-test` run this: the rule generator is exporter/mixin/alerts/generate.py."""

import sys

from exporter.mixin.alerts.generate import main

sys.exit(main())
