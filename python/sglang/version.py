"""The package version, a module of its own so that any layer may read it without importing the
package root (whose lazy ``Engine`` would close an import cycle)."""

__version__ = "0.1.0"
