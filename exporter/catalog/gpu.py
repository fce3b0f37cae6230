"""gpu families; filled in by the gpu source."""

FAMILIES: tuple = ()
