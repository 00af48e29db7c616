"""Stand-in for radixark/miles: the surface fastaccum.miles touches (tests/miles_double/README.md)."""
