"""The run machinery: the accelerator that dispatches the hooks (``accelerator``), the step
sequence (``sequence``), the guard, memory and placement, the plugin registry (``registry``),
the adapter registry (``adapters_registry``), configs (``config``) and generate jobs (``jobs``).

Plugins do not import it (import-linter's plugin contract): what they need is at the top,
``diffaccel.apply``, ``diffaccel.load_config``, ``diffaccel.get_adapter``, ...
"""
