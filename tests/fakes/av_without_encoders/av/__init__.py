"""A PyAV build without video encoders (an outside system this machine's PyAV is not): put this folder first on
PYTHONPATH and `hg-dagger export --video ...` meets a machine that lacks the codec."""

__version__ = "0.0-no-encoders"


class _Codecs:
    class Codec:
        def __init__(self, name, mode="r"):
            raise ValueError(f"codec {name!r} is not available")


codec = _Codecs()
