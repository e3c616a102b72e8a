"""Regenerates dtx/v1 from the wire contract (../proto/proto/dtx/v1/dtx.proto).

    python generate.py            # rewrite dtx/v1
    python generate.py OUT_DIR    # write elsewhere (the drift test compares that with dtx/v1)

Needs grpcio-tools at the version pyproject.toml pins in the `test` extra.
"""

import pathlib
import sys

from grpc_tools import protoc

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent / "proto" / "proto"


def generate(out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        str(PROTO_ROOT / "dtx" / "v1" / "dtx.proto"),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return out / "dtx" / "v1"


if __name__ == "__main__":
    generate(sys.argv[1] if len(sys.argv) > 1 else HERE)
