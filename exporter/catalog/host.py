"""host families; filled in by the host source."""

FAMILIES: tuple = ()
