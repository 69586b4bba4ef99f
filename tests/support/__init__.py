"""Helpers shared by the tests: stores, bridge robots, app drivers, CLI processes, virtual devices."""
