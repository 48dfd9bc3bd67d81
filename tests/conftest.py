"""Suite-wide settings."""

import os

# Compiled models take the untuned default core for each matrix product (deterministic, no timing
# in tests); tests/test_tuning.py turns the tuner on explicitly where it is what is tested.
os.environ.setdefault("AUTOFUSION_TUNE", "0")
