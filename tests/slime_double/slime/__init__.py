"""Test double of THUDM/slime (see ../README.md); never installed."""
