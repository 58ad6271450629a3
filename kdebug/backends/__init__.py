"""torch.compile backends for bringing up an accelerator behind Inductor
(docs/bringup.md): ``constrained(caps)`` checks every graph against an
accelerator's declared capabilities (Note [Constraint backend])."""
from ..capabilities import AcceleratorAdapter, AcceleratorCapabilities
from ..constraint_check import GraphCheck, Violation
from .constrained import (ConstrainedBackend, ConstraintViolationError, checks, clear_violations, constrained,
                          minified, minify_by_default, violations)

__all__ = ["AcceleratorAdapter", "AcceleratorCapabilities", "ConstrainedBackend", "ConstraintViolationError",
           "GraphCheck", "Violation", "checks", "clear_violations", "constrained", "minified", "minify_by_default", "violations"]
