import pytest


def pytest_addoption(parser):
    parser.addoption("--glossa_cli", required=True, help="the glossa program")


@pytest.fixture
def glossa_cli(request):
    return request.config.getoption("--glossa_cli")
