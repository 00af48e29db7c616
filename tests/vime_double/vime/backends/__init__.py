"""vime test double (tests/vime_double/README.md): not vime."""
