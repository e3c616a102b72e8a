"""What keeps the Python package from drifting from the Rust side: the generated code is what
the proto generates today, and the barrier migrations are the Rust SDK's, byte for byte (the
same table, and checksums the Rust migrator accepts on a database Python migrated)."""

import importlib.util
import pathlib

import pytest

import dtx.db

HERE = pathlib.Path(__file__).resolve().parent
PACKAGE = HERE.parent
REPO = PACKAGE.parent


def _generate():
    spec = importlib.util.spec_from_file_location("generate", PACKAGE / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate


def test_the_generated_code_matches_the_proto(tmp_path):
    fresh = _generate()(tmp_path)
    committed = PACKAGE / "dtx" / "v1"
    names = ["dtx_pb2.py", "dtx_pb2.pyi", "dtx_pb2_grpc.py"]
    for name in names:
        assert (fresh / name).read_bytes() == (committed / name).read_bytes(), (
            f"dtx/v1/{name} is stale: run `python generate.py` in sdk-python"
        )


@pytest.mark.parametrize("dialect", ["postgres", "mysql", "sqlite"])
def test_the_barrier_migrations_are_the_rust_sdks(dialect):
    rust = sorted((REPO / "migrations" / dialect / "barrier").glob("*.sql"))
    python = sorted((PACKAGE / "dtx" / "migrations" / dialect).glob("*.sql"))
    assert [p.name for p in python] == [p.name for p in rust]
    for ours, theirs in zip(python, rust):
        assert ours.read_bytes() == theirs.read_bytes(), f"{ours} differs from {theirs}"
    assert [version for version, _, _ in dtx.db.migrations(dialect)] == [
        int(p.name.split("_", 1)[0]) for p in rust
    ]
