"""Repository-wide pytest configuration: every suite shares the harness's fixtures
(:mod:`understudy_harness.pytest_plugin`: ZooKeeper, a chroot client, broker processes)."""

pytest_plugins = ["understudy_harness.pytest_plugin"]
