"""autofusion: declarative, checked, cost-driven operator fusion for deep-learning graphs.

``autofusion.optimize(graph, rules, cost_model=..., strategy=...)`` is the embedding API (imported
lazily, so ``import autofusion`` stays light and the rule checker never loads egglog).
"""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "optimize":
        from autofusion.api import optimize

        return optimize
    raise AttributeError(f"module 'autofusion' has no attribute {name!r}")
