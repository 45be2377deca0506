"""The three services' entry points, for running them from a checkout: ``python -m services.speech``,
``python -m services.reasoning``, ``python -m services.broadcast``. Each ``__main__`` only wires the
SDK's parts together; an installed bargein runs the same with ``bargein speech`` (and so on). This
package is not installed with bargein: everything it runs lives in ``bargein``."""
