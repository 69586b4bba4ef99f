"""The desktop application (installed as hg_dagger.ui): operator console and review workspace. Nothing imports ui."""
