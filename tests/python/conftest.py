import os

import pytest

import glossa  # noqa: F401  (before torch: OpenBLAS's kernels as the glossa program picks them)

# Subprocesses run in other directories: the glossa package's path must be absolute.
os.environ["PYTHONPATH"] = ":".join(
    os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(":") if p)


def pytest_addoption(parser):
    parser.addoption("--glossa_cli", required=True, help="the glossa program")


@pytest.fixture
def glossa_cli(request):
    return os.path.abspath(request.config.getoption("--glossa_cli"))
