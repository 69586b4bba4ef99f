"""Operator input devices (installed as hg_dagger.devices): gamepad, SpaceMouse, keyboard, synthetic operator."""
