"""derived families; filled in by the derived source."""

FAMILIES: tuple = ()
