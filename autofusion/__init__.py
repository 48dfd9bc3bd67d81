"""autofusion: declarative, checked, cost-driven operator fusion for deep-learning graphs."""

__version__ = "0.1.0"
