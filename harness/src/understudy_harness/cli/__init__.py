"""The harness's commands: ``understudy drill`` and ``understudy workload``, registered as
``understudy.commands`` entry points (see pyproject.toml)."""
