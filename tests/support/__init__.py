"""What the tests share: servers on loopback, the one fake engine and its fault injectors,
the real components' launchers and fixtures, and the one polling helper (tests/README.md)."""
