"""The native API surface: ``/generate``, ``/health``, ``/ready``, ``/v1/requests/{id}``."""
