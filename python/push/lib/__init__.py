"""PusH's ``push.lib``: the helpers PusH programs import from it (``push.lib.utils``). PusH's
runtime internals (its node event loops, particle caches and messages) are push's C++ runtime
here and have no Python names."""
