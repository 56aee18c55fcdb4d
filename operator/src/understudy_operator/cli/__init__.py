"""The operator package's commands: ``understudy local``, ``group``, ``controller`` and
``operator``, registered as ``understudy.commands`` entry points (see pyproject.toml)."""
