"""A test double of the AReaL surface fastaccum.areal touches (tests/areal_double/README.md)."""
