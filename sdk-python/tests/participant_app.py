"""A Python participant as its own process, for the cross-language tests the Rust suite runs
(tests/tests/cross_language.rs): ``python participant_app.py SQLITE_FILE``.

It migrates the barrier on the file, serves the saga steps ``ship`` (writes a ledger row,
succeeds; its compensation writes one too) and ``fail`` (refuses, its write undone), the TCC
resource ``hold`` (each phase writes a ledger row) and the check-backs ``orders`` of the
messages ``message_initiator.py`` prepares on the same file, on a free port, prints ``listening on PORT`` and serves until stdin closes (so it dies with its parent)."""

import os
import sys

from conftest import LEDGER, recording, refusing

import dtx


def main(path):
    db = dtx.Sqlite(path)
    db.migrate()
    with db.transaction() as tx:
        tx.execute(LEDGER["sqlite"].replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))
    service = (
        dtx.ParticipantServer(db)
        .saga("ship", recording(db, "action"), recording(db, "compensate"))
        .saga("fail", refusing(db, "action"), recording(db, "compensate"))
        .tcc("hold", recording(db, "try"), recording(db, "confirm"), recording(db, "cancel"))
        # The check-backs of the messages message_initiator.py prepares on the same file.
        .message_check_back("orders")
    )
    # With DTX_TLS_CERT/KEY (and DTX_TLS_CLIENT_CA for mTLS): TLS only.
    tls = None
    if os.environ.get("DTX_TLS_CERT"):
        tls = dtx.ServerTls.from_files(
            os.environ["DTX_TLS_CERT"],
            os.environ["DTX_TLS_KEY"],
            os.environ.get("DTX_TLS_CLIENT_CA"),
        )
    server, port = service.serve(tls=tls)
    # With DTX_CALL_PUBLIC_KEY (the coordinator's public key, PEM): only its signed calls.
    if os.environ.get("DTX_CALL_PUBLIC_KEY"):
        scheme = "https" if tls else "http"
        service.verify_calls(
            dtx.CallVerifier.from_file(
                os.environ["DTX_CALL_PUBLIC_KEY"], [f"{scheme}://127.0.0.1:{port}"]
            )
        )
    print(f"listening on {port}", flush=True)
    sys.stdin.read()
    server.stop(grace=1).wait()


if __name__ == "__main__":
    main(sys.argv[1])
