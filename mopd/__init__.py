"""MultiAgent-OPD."""
__version__ = "0.1.0"

# The built-in engines and rewards register themselves where they are implemented; importing those
# two small modules here (no torch) fills the config's registries before any module of mopd runs, so
# every config checks its names against full registries (mopd/config/registries.py says why).
from mopd.rollout import engines as _engines  # noqa: E402,F401
from mopd.algo import rewards as _rewards  # noqa: E402,F401
