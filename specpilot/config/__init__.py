"""The engine's one typed configuration: the option registry, systems parsed from `base[:key=value,...]`,
the kernel plan the kernels are handed, and the environment overrides read at the command-line edge."""

from specpilot.config.options import BASES, GROUPS, OPTIONS, Option
from specpilot.config.plan import KernelPlan
from specpilot.config.system import System, parse_system

__all__ = ["BASES", "GROUPS", "OPTIONS", "KernelPlan", "Option", "System", "parse_system"]
